package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
)

// BenchmarkRestore compares, for the same image and guest size, a cold
// boot to the first exec (create, start, exec) with a restore from a
// snapshot to the first exec (restore, exec). The goal is a ratio of at
// most 0.3.
func BenchmarkRestore(b *testing.B) {
	setup(b)
	src, snap := "bench-snap-src", "bench-snap"
	smx("agent", "rm", "-f", src)
	smx("snapshot", "rm", snap)
	if out, err := smx("agent", "create", src, "--memory", "512M"); err != nil {
		b.Fatal(err, out)
	}
	defer smx("agent", "rm", "-f", src)
	if out, err := smx("agent", "start", src); err != nil {
		b.Fatal(err, out)
	}
	if out, err := smx("snapshot", "create", src, "--name", snap); err != nil {
		b.Fatal(err, out)
	}
	defer smx("snapshot", "rm", snap)

	b.Run("cold-boot-to-first-exec", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			name := fmt.Sprintf("bench-cold-%d", i)
			if out, err := smx("agent", "create", name, "--memory", "512M"); err != nil {
				b.Fatal(err, out)
			}
			if out, err := smx("agent", "start", "--cold", name); err != nil {
				b.Fatal(err, out)
			}
			if out, err := smx("agent", "exec", name, "--", "true"); err != nil {
				b.Fatal(err, out)
			}
			b.StopTimer()
			smx("agent", "rm", "-f", name)
			b.StartTimer()
		}
	})
	b.Run("restore-to-first-exec", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			name := fmt.Sprintf("bench-fork-%d", i)
			if out, err := smx("agent", "restore", snap, "--name", name); err != nil {
				b.Fatal(err, out)
			}
			if out, err := smx("agent", "exec", name, "--", "true"); err != nil {
				b.Fatal(err, out)
			}
			b.StopTimer()
			smx("agent", "rm", "-f", name)
			b.StartTimer()
		}
	})
}

// BenchmarkPauseResume measures a pause and a resume of a running sandbox
// through the supervisor's API (no CLI process start-up).
func BenchmarkPauseResume(b *testing.B) {
	setup(b)
	name := "bench-pause"
	smx("agent", "rm", "-f", name)
	if _, err := smx("agent", "create", name); err != nil {
		b.Fatal(err)
	}
	if _, err := smx("agent", "start", name); err != nil {
		b.Fatal(err)
	}
	defer smx("agent", "rm", "-f", name)
	c := &sandbox.Client{Paths: (&sandbox.Manager{State: statedir.Dir{Root: home}}).Paths(name)}
	ctx := context.Background()
	var pause, resume time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := c.Pause(ctx); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := c.Resume(ctx); err != nil {
			b.Fatal(err)
		}
		pause += t1.Sub(t0)
		resume += time.Since(t1)
	}
	b.ReportMetric(float64(pause.Microseconds())/float64(b.N), "pause-µs")
	b.ReportMetric(float64(resume.Microseconds())/float64(b.N), "resume-µs")
}

// BenchmarkSnapshotSize reports the saved memory state of idle guests of
// 256 MiB and 1 GiB: untouched (zero) pages must not cost space, so the
// state should hardly grow with guest RAM.
func BenchmarkSnapshotSize(b *testing.B) {
	setup(b)
	for _, mem := range []string{"256M", "1G"} {
		b.Run(mem, func(b *testing.B) {
			name, snap := "bench-size-"+mem, "bench-size-"+mem
			smx("agent", "rm", "-f", name)
			smx("snapshot", "rm", snap)
			if out, err := smx("agent", "create", name, "--memory", mem); err != nil {
				b.Fatal(err, out)
			}
			defer smx("agent", "rm", "-f", name)
			if out, err := smx("agent", "start", name); err != nil {
				b.Fatal(err, out)
			}
			var sn *snapshot.Snapshot
			for i := 0; i < b.N; i++ {
				smx("snapshot", "rm", snap)
				if out, err := smx("snapshot", "create", name, "--name", snap); err != nil {
					b.Fatal(err, out)
				}
				var err error
				if sn, err = (&snapshot.Store{Dir: statedir.Dir{Root: home}.Snapshots()}).Get(snap); err != nil {
					b.Fatal(err)
				}
			}
			smx("snapshot", "rm", snap)
			b.ReportMetric(float64(sn.MemoryStateBytes)/(1<<20), "state-MiB")
			b.ReportMetric(float64(sn.MemoryMiB), "guest-RAM-MiB")
			b.ReportMetric(float64(sn.MemoryStateBytes)/float64(int64(sn.MemoryMiB)<<20), "state/RAM")
			b.ReportMetric(float64(sn.SaveMS), "paused-ms")
		})
	}
}
