package bench

import (
	"fmt"
	"testing"

	"smx/internal/sandbox"
	"smx/internal/statedir"
)

// BenchmarkTenForksMemory reports the host memory (QEMU + supervisor RSS,
// summed) of ten sandboxes forked from one snapshot next to ten cold-booted
// ones of the same image and size, each measured idle after its first exec.
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
	for i := 0; i < b.N; i++ {
		for j := 0; j < n; j++ {
			cold, fork := fmt.Sprintf("bench-cold-%d", j), fmt.Sprintf("bench-fork-%d", j)
			for _, args := range [][]string{
				{"agent", "create", cold, "--memory", "256M"}, {"agent", "start", "--cold", cold}, {"agent", "exec", cold, "--", "true"},
				{"agent", "restore", snap, "--name", fork}, {"agent", "exec", fork, "--", "true"},
			} {
				if out, err := smx(args...); err != nil {
					b.Fatal(err, out)
				}
			}
		}
		b.ReportMetric(total("bench-cold"), "cold-MiB")
		b.ReportMetric(total("bench-fork"), "forks-MiB")
		for j := 0; j < n; j++ {
			smx("agent", "rm", "-f", fmt.Sprintf("bench-cold-%d", j), fmt.Sprintf("bench-fork-%d", j))
		}
	}
}
