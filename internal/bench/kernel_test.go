package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/vm"
)

// BenchmarkOwnKernel puts smx's own kernel (everything built in) side by
// side with the distribution kernel, in one run, rounds interleaved so
// both see the same load:
//
//   - bare QEMU booting each kernel to an init that powers off at once;
//   - `smx run --cold -- true` end to end on each kernel;
//   - `smx run -- true` from a boot template on each kernel;
//   - guest boot to the first exec on the guest clock (/proc/uptime read by
//     the command `smx run --cold` runs), on each kernel.
//
// The ratios are reported as metrics: cold-own/bare-own (goal ≤ 1.15),
// cold-own/bare-stock (goal ≤ 1.0), template-own/bare-own (goal ≤ 0.5).
// Each kernel gets a state directory of its own whose kernel cache holds
// only it, so new sandboxes boot it.
func BenchmarkOwnKernel(b *testing.B) {
	setup(b)
	own, err := kernel.Find(filepath.Join(home, "kernels"))
	if err != nil || !own.Own {
		b.Skipf("smx's own kernel is not built (`smx kernel build`): %v", err)
	}
	stock, err := kernel.FindStock(filepath.Join(home, "kernels"))
	if err != nil {
		b.Fatal(err)
	}
	accel, why := vm.DetectAccel()
	b.Logf("accelerator: %s (%s); own %s, stock %s", accel, why, own.Version, stock.Version)
	initrd := bareInitramfs(b)
	homes := map[*kernel.Kernel]string{}
	for _, k := range []*kernel.Kernel{own, stock} {
		h := filepath.Join(b.TempDir(), "home")
		if err := os.MkdirAll(filepath.Join(h, "kernels"), 0o755); err != nil {
			b.Fatal(err)
		}
		// `smx run` returns before its supervisor has removed the
		// sandbox: let the last ones go before the directory does.
		b.Cleanup(func() { awaitNoSandboxes(h) })
		if err := os.Symlink(k.Dir, filepath.Join(h, "kernels", k.Version)); err != nil {
			b.Fatal(err)
		}
		if out, err := smxIn(h, "image", "build", "busybox", "--from", "busybox"); err != nil {
			b.Fatal(err, out)
		}
		// The first run saves the boot template the template rounds use.
		if out, err := smxIn(h, "run", "--", "true"); err != nil {
			b.Fatal(err, out)
		}
		homes[k] = h
	}

	bare := func(k *kernel.Kernel) time.Duration {
		cfg := vm.Config{
			Accel: accel, CPUs: 1, MemoryMiB: 512,
			Kernel: k.BootImage(), Initrd: initrd,
			Cmdline:   "console=ttyS0 panic=-1 quiet loglevel=3",
			Devices:   []vm.Device{vm.Console{LogPath: filepath.Join(b.TempDir(), "console.log")}},
			QMPSocket: filepath.Join(b.TempDir(), "qmp.sock"),
		}
		start := time.Now()
		m, err := vm.Start(context.Background(), cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		m.Wait()
		d := time.Since(start)
		m.Close()
		return d
	}
	run := func(k *kernel.Kernel, args ...string) (time.Duration, string) {
		start := time.Now()
		out, err := smxStdout(homes[k], append([]string{"run"}, args...)...)
		if err != nil {
			b.Fatal(err, out)
		}
		return time.Since(start), out
	}
	type sums struct{ bare, cold, tpl, uptime time.Duration }
	res := map[*kernel.Kernel]*sums{own: {}, stock: {}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, k := range []*kernel.Kernel{own, stock} {
			s := res[k]
			s.bare += bare(k)
			d, _ := run(k, "--cold", "--", "true")
			s.cold += d
			d, _ = run(k, "--", "true")
			s.tpl += d
			_, out := run(k, "--cold", "--", "cat", "/proc/uptime")
			f := strings.Fields(out)
			if len(f) == 0 {
				b.Fatalf("uptime: %q", out)
			}
			up, err := strconv.ParseFloat(f[0], 64)
			if err != nil {
				b.Fatalf("uptime: %q", out)
			}
			s.uptime += time.Duration(up * float64(time.Second))
		}
	}
	b.StopTimer()
	n := float64(b.N)
	sec := func(d time.Duration) float64 { return d.Seconds() / n }
	o, s := res[own], res[stock]
	b.ReportMetric(sec(o.bare), "bare-own-s")
	b.ReportMetric(sec(s.bare), "bare-stock-s")
	b.ReportMetric(sec(o.cold), "cold-own-s")
	b.ReportMetric(sec(s.cold), "cold-stock-s")
	b.ReportMetric(sec(o.tpl), "template-own-s")
	b.ReportMetric(sec(s.tpl), "template-stock-s")
	b.ReportMetric(sec(o.uptime), "guest-uptime-own-s")
	b.ReportMetric(sec(s.uptime), "guest-uptime-stock-s")
	b.ReportMetric(o.cold.Seconds()/o.bare.Seconds(), "cold-own/bare-own")
	b.ReportMetric(o.cold.Seconds()/s.bare.Seconds(), "cold-own/bare-stock")
	b.ReportMetric(s.cold.Seconds()/s.bare.Seconds(), "cold-stock/bare-stock")
	b.ReportMetric(o.tpl.Seconds()/o.bare.Seconds(), "template-own/bare-own")
	b.ReportMetric(o.uptime.Seconds()/s.uptime.Seconds(), "uptime-own/stock")
}

// smxIn runs smx with SMX_HOME=h.
func smxIn(h string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(bin, "smx"), args...)
	cmd.Env = append(os.Environ(), "SMX_HOME="+h)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// smxStdout runs smx with SMX_HOME=h and returns its stdout alone.
func smxStdout(h string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(bin, "smx"), args...)
	cmd.Env = append(os.Environ(), "SMX_HOME="+h)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok {
		return string(out) + string(ee.Stderr), err
	}
	return string(out), err
}
