package bench

import (
	"fmt"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
)

// BenchmarkTenForksMemory reports the host memory (QEMU + supervisor RSS,
// summed) of ten sandboxes forked from one snapshot next to ten cold-booted
// ones and ten started from the boot template, of the same image and size,
// each measured idle after its first exec; and how many of each start per
// minute, one after the other (create to first exec done).
// A restored guest's RAM is loaded from the state file into anonymous
// memory, so without page sharing (KSM) forks cost what their guests
// touched, as cold boots do.
func BenchmarkTenForksMemory(b *testing.B) {
	setup(b)
	const n = 10
	src, snap := "bench-mem-src", "bench-mem-snap"
	smx("agent", "rm", "-f", src)
	smx("snapshot", "rm", snap)
	if out, err := smx("agent", "create", src, "--memory", "256M"); err != nil {
		b.Fatal(err, out)
	}
	defer smx("agent", "rm", "-f", src)
	if out, err := smx("agent", "start", src); err != nil {
		b.Fatal(err, out)
	}
	if out, err := smx("snapshot", "create", src, "--name", snap, "--stop"); err != nil {
		b.Fatal(err, out)
	}
	defer smx("snapshot", "rm", snap)
	m := &sandbox.Manager{State: statedir.Dir{Root: home}}
	total := func(prefix string) float64 {
		var sum float64
		for i := 0; i < n; i++ {
			in, err := m.Get(fmt.Sprintf("%s-%d", prefix, i))
			if err != nil {
				b.Fatal(err)
			}
			sum += rssMiB(in.State.QEMUPID) + rssMiB(in.State.SupervisorPID)
		}
		return sum
	}
	// start runs each sandbox's commands in turn and returns starts per
	// minute (create to first exec done).
	start := func(steps func(name string) [][]string, prefix string, env ...string) float64 {
		t0 := time.Now()
		for j := 0; j < n; j++ {
			for _, args := range steps(fmt.Sprintf("%s-%d", prefix, j)) {
				if out, err := smxEnv(env, args...); err != nil {
					b.Fatal(err, out)
				}
			}
		}
		return float64(n) / time.Since(t0).Minutes()
	}
	for i := 0; i < b.N; i++ {
		coldRate := start(func(name string) [][]string {
			return [][]string{{"agent", "create", name, "--memory", "256M"}, {"agent", "start", "--cold", name}, {"agent", "exec", name, "--", "true"}}
		}, "bench-cold")
		forkRate := start(func(name string) [][]string {
			return [][]string{{"agent", "restore", snap, "--name", name}, {"agent", "exec", name, "--", "true"}}
		}, "bench-fork")
		// The source's first start saved the boot template of this shape
		// and made its shared-RAM form; the stream form is the whole state
		// loaded through QEMU (SMX_TEMPLATE_SHARED_RAM=0).
		awaitSharedRAM(b)
		tplSteps := func(name string) [][]string {
			return [][]string{{"agent", "create", name, "--memory", "256M"}, {"agent", "start", name}, {"agent", "exec", name, "--", "true"}}
		}
		tplRate := start(tplSteps, "bench-tpl")
		streamRate := start(tplSteps, "bench-tpls", "SMX_TEMPLATE_SHARED_RAM=0")
		b.ReportMetric(total("bench-cold"), "cold-MiB")
		b.ReportMetric(total("bench-fork"), "forks-MiB")
		b.ReportMetric(total("bench-tpl"), "template-MiB")
		b.ReportMetric(total("bench-tpls"), "template-stream-MiB")
		b.ReportMetric(coldRate, "cold-starts/min")
		b.ReportMetric(forkRate, "fork-starts/min")
		b.ReportMetric(tplRate, "template-starts/min")
		b.ReportMetric(streamRate, "template-stream-starts/min")
		for j := 0; j < n; j++ {
			smx("agent", "rm", "-f", fmt.Sprintf("bench-cold-%d", j), fmt.Sprintf("bench-fork-%d", j), fmt.Sprintf("bench-tpl-%d", j), fmt.Sprintf("bench-tpls-%d", j))
		}
	}
}
