package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/vm"
)

// BenchmarkSnapshotVirtioFS compares, side by side on one QEMU (8.2 or
// newer: set SMX_QEMU), kernel, image and guest size, a snapshot and a
// restore of a sandbox with a virtio-fs mount (its device state travels
// in the snapshot: the node and handle tables, 200 files open) with the
// same sandbox without a mount. Each is taken b.N times
// (-benchtime=Nx); medians and their ratios are logged (run with -v):
// the snapshot command end to end, the time the guest stood paused
// (SaveMS), the state's size, and a restore to the first exec.
func BenchmarkSnapshotVirtioFS(b *testing.B) {
	line, err := vm.QEMUVersion(context.Background(), "")
	if err != nil || !vm.VirtioFSCapable(line) {
		b.Skipf("virtio-fs needs QEMU >= 8.2 (have %q): set SMX_QEMU", line)
	}
	setup(b)
	share := b.TempDir()
	for i := range 200 {
		os.WriteFile(filepath.Join(share, fmt.Sprintf("f%03d", i)), []byte("x\n"), 0o644)
	}
	vfs := startSMXFiles(b, "bench-snap-vfs", share, "virtiofs")
	defer vfs.Close()
	// The plain peer: same size and profile, no mount.
	smx("agent", "rm", "-f", "bench-snap-plain")
	if out, err := smx("agent", "create", "bench-snap-plain", "--memory", "512M", "--profile", "dev"); err != nil {
		b.Fatal(err, out)
	}
	defer smx("agent", "rm", "-f", "bench-snap-plain")
	if out, err := smx("agent", "start", "bench-snap-plain"); err != nil {
		b.Fatal(err, out)
	}
	// 200 files held open by a process in the mount.
	if out, err := vfs.Exec(nil, "sh", "-c", `cd /work && setsid sh -c 'i=10; for f in f*; do eval "exec $i<$f"; i=$((i+1)); done; sleep 100000' </dev/null >/dev/null 2>&1 & sleep 2; ls /proc/$(pidof sleep | cut -d" " -f1)/fd | wc -l`); err != nil || atoi(out) < 200 {
		b.Fatalf("the holder of 200 open files: %v\n%s", err, out)
	}
	store := &snapshot.Store{Dir: statedir.Dir{Root: home}.Snapshots()}
	type result struct {
		snap, paused, restore time.Duration
		bytes                 int64
	}
	res := map[string]*result{}
	for _, peer := range []string{"bench-snap-vfs", "bench-snap-plain"} {
		var snaps, pauses, restores []time.Duration
		var size int64
		for i := 0; i < b.N; i++ {
			name := fmt.Sprintf("%s-s%d", peer, i)
			smx("snapshot", "rm", name)
			t0 := time.Now()
			if out, err := smx("snapshot", "create", peer, "--name", name); err != nil {
				b.Fatal(err, out)
			}
			snaps = append(snaps, time.Since(t0))
			sn, err := store.Get(name)
			if err != nil {
				b.Fatal(err)
			}
			pauses = append(pauses, time.Duration(sn.SaveMS)*time.Millisecond)
			size = sn.MemoryStateBytes
			fork := fmt.Sprintf("%s-f%d", peer, i)
			t1 := time.Now()
			if out, err := smx("agent", "restore", name, "--name", fork); err != nil {
				b.Fatal(err, out)
			}
			if out, err := smx("agent", "exec", fork, "--", "true"); err != nil {
				b.Fatal(err, out)
			}
			restores = append(restores, time.Since(t1))
			smx("agent", "rm", "-f", fork)
			smx("snapshot", "rm", name)
		}
		med := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
		res[peer] = &result{med(snaps), med(pauses), med(restores), size}
	}
	v, p := res["bench-snap-vfs"], res["bench-snap-plain"]
	b.ReportMetric(float64(v.snap.Milliseconds()), "vfs-snapshot-ms")
	b.ReportMetric(float64(p.snap.Milliseconds()), "plain-snapshot-ms")
	b.ReportMetric(float64(v.snap)/float64(p.snap), "snapshot-vfs/plain")
	b.ReportMetric(float64(v.paused)/float64(max(p.paused, time.Millisecond)), "paused-vfs/plain")
	b.ReportMetric(float64(v.restore)/float64(p.restore), "restore-vfs/plain")
	b.Logf("median of %d: snapshot %v with a virtio-fs mount vs %v without (%.2fx); paused %v vs %v; state %d vs %d bytes; restore to first exec %v vs %v (%.2fx)",
		b.N, v.snap, p.snap, float64(v.snap)/float64(p.snap), v.paused, p.paused, v.bytes, p.bytes, v.restore, p.restore, float64(v.restore)/float64(p.restore))
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}
