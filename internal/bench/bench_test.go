// Package bench measures smx side by side with its nearest peer run in the
// same process: bare QEMU booting the same kernel. Run with
//
//	go test -run '^$' -bench . -benchtime 5x ./internal/bench/
//
// and compare ns/op between sub-benchmarks of the same group, or run
// scripts/bench.sh [-quick], which runs them and writes docs/benchmarks.md
// (internal/bench/report) with the machine they ran on.
package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/initramfs"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/supproto"
	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/internal/vm"
)

var (
	setupOnce sync.Once
	home      string
	bin       string
	setupErr  error
)

func setup(b *testing.B) {
	b.Helper()
	testutil.RequireQEMU(b)
	kernels := testutil.KernelCache(b)
	bin = testutil.Binaries(b)
	setupOnce.Do(func() {
		home, setupErr = os.MkdirTemp("", "smx-bench-")
		if setupErr != nil {
			return
		}
		if setupErr = os.Symlink(kernels, filepath.Join(home, "kernels")); setupErr != nil {
			return
		}
		_, setupErr = smx("image", "build", "busybox", "--from", "busybox")
	})
	if setupErr != nil {
		b.Fatal(setupErr)
	}
}

func smx(args ...string) (string, error) { return smxEnv(nil, args...) }

// smxEnv is smx with env added to the environment.
func smxEnv(env []string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(bin, "smx"), args...)
	cmd.Env = append(append(os.Environ(), "SMX_HOME="+home), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("smx %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// BenchmarkColdStart compares `smx run -- true` end to end (CLI, supervisor,
// boot or template restore, agent, exec, exit) with bare QEMU booting the
// same kernel (the newest cached: smx's own once built) with an
// initramfs whose init powers off at once: cold (--cold) and from a boot
// template, in the template's shared-RAM form (the default once it is
// made) and in its stream form (SMX_TEMPLATE_SHARED_RAM=0: the whole
// state loaded through QEMU). All run in turn in every round, so all see
// the same load; the ratios are reported as metrics (goals: cold/bare ≤
// 1.15, template/bare ≤ 0.5).
//
// SMX_BENCH_BASELINE=DIR (a directory with another build's smx and
// smx-agent, e.g. of the last release) adds that build's cold and template
// rounds to every round, in a state directory of its own, and reports its
// ratios too: before and after a change, under the same load.
func BenchmarkColdStart(b *testing.B) {
	setup(b)
	k, err := kernel.Find(filepath.Join(home, "kernels"))
	if err != nil {
		b.Fatal(err)
	}
	initrd := bareInitramfs(b)
	accel, why := vm.DetectAccel()
	b.Logf("accelerator: %s (%s); kernel %s", accel, why, k.Version)
	bare := func() time.Duration {
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
	runEnv := func(env []string, args ...string) time.Duration {
		start := time.Now()
		if out, err := smxEnv(env, append([]string{"run"}, args...)...); err != nil {
			b.Fatal(err, out)
		}
		return time.Since(start)
	}
	run := func(args ...string) time.Duration { return runEnv(nil, args...) }
	stream := []string{"SMX_TEMPLATE_SHARED_RAM=0"}
	baseline := os.Getenv("SMX_BENCH_BASELINE")
	var baseHome string
	runBase := func(args ...string) time.Duration {
		start := time.Now()
		cmd := exec.Command(filepath.Join(baseline, "smx"), append([]string{"run"}, args...)...)
		cmd.Env = append(os.Environ(), "SMX_HOME="+baseHome, "SMX_AGENT="+filepath.Join(baseline, "smx-agent"))
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatal("baseline: ", err, string(out))
		}
		return time.Since(start)
	}
	// The first run of this machine shape saves the boot template the
	// template rounds restore, and converts it in the background.
	run("--", "true")
	awaitSharedRAM(b)
	if baseline != "" {
		baseHome = filepath.Join(b.TempDir(), "home")
		os.MkdirAll(baseHome, 0o755)
		// `smx run` returns before its supervisor has removed the
		// sandbox: let the last ones go before the directory does.
		b.Cleanup(func() { awaitNoSandboxes(baseHome) })
		if err := os.Symlink(filepath.Join(home, "kernels"), filepath.Join(baseHome, "kernels")); err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(baseline, "smx"), "image", "build", "busybox", "--from", "busybox")
		cmd.Env = append(os.Environ(), "SMX_HOME="+baseHome)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatal(err, string(out))
		}
		runBase("--", "true")
	}
	var sBare, sCold, sTpl, sStream, sBaseCold, sBaseTpl time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sBare += bare()
		sCold += run("--cold", "--", "true")
		sTpl += run("--", "true")
		sStream += runEnv(stream, "--", "true")
		if baseline != "" {
			sBaseCold += runBase("--cold", "--", "true")
			sBaseTpl += runBase("--", "true")
		}
	}
	b.StopTimer()
	n := float64(b.N)
	if baseline != "" {
		b.ReportMetric(sBaseCold.Seconds()/sBare.Seconds(), "baseline-cold/bare")
		b.ReportMetric(sBaseTpl.Seconds()/sBare.Seconds(), "baseline-template/bare")
	}
	b.ReportMetric(sBare.Seconds()/n, "bare-s")
	b.ReportMetric(sCold.Seconds()/n, "cold-s")
	b.ReportMetric(sTpl.Seconds()/n, "template-s")
	b.ReportMetric(sStream.Seconds()/n, "template-stream-s")
	b.ReportMetric(sCold.Seconds()/sBare.Seconds(), "cold/bare")
	b.ReportMetric(sTpl.Seconds()/sBare.Seconds(), "template/bare")
	b.ReportMetric(sStream.Seconds()/sBare.Seconds(), "template-stream/bare")
}

// awaitNoSandboxes waits, up to 20 s, until state directory h holds no
// sandbox.
func awaitNoSandboxes(h string) {
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if e, _ := os.ReadDir(filepath.Join(h, "sandboxes")); len(e) == 0 {
			return
		}
	}
}

// awaitSharedRAM waits for every template in the state directory to have
// its shared-RAM form, which the start that saved it makes in the
// background.
func awaitSharedRAM(b *testing.B) {
	b.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		tpls, _ := filepath.Glob(filepath.Join(home, "templates", "tpl-*"))
		done := 0
		for _, t := range tpls {
			if _, err := os.Stat(filepath.Join(t, "devices.state")); err == nil {
				done++
			}
		}
		if len(tpls) > 0 && done == len(tpls) {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("templates without their shared-RAM form after 3 minutes: %d of %d", len(tpls)-done, len(tpls))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// bareInitramfs is an archive with only /init, a static program that
// powers the machine off.
func bareInitramfs(b *testing.B) string {
	dir := b.TempDir()
	prog := filepath.Join(dir, "poweroff")
	cmd := exec.Command("go", "build", "-o", prog, "./testdata/poweroff")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("build poweroff: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "bare.cpio")
	f, err := os.Create(out)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := initramfs.WriteSingleInit(f, prog); err != nil {
		b.Fatal(err)
	}
	return out
}

// BenchmarkExec measures an exec round trip in a running sandbox: through
// the CLI (process start-up included) and through the Go API.
func BenchmarkExec(b *testing.B) {
	setup(b)
	name := "bench-exec"
	smx("agent", "rm", "-f", name)
	if _, err := smx("agent", "create", name); err != nil {
		b.Fatal(err)
	}
	if _, err := smx("agent", "start", name); err != nil {
		b.Fatal(err)
	}
	defer smx("agent", "rm", "-f", name)
	b.Run("cli", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if out, err := smx("agent", "exec", name, "--", "true"); err != nil {
				b.Fatal(err, out)
			}
		}
	})
	c := &sandbox.Client{Paths: (&sandbox.Manager{State: statedir.Dir{Root: home}}).Paths(name)}
	b.Run("api", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			st, err := c.Exec(context.Background(), supproto.ExecRequest{Args: []string{"true"}}, sandbox.ExecIO{})
			if err != nil || st.Code != 0 {
				b.Fatal(err, st)
			}
		}
	})
	b.Run("api-health", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := c.Health(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkFirstExec measures, in sandboxes started from the boot
// template (shared-RAM form), the first exec's round trip through the Go
// API against the next three's: what the restored guest pays for running
// the agent's and the kernel's exec path for the first time in a new QEMU
// process (under TCG, translating it again: a saved state carries no
// translated code), next to the same exec once translated. The template
// was saved after the same exec ran, so the guest's page cache is warm in
// both.
func BenchmarkFirstExec(b *testing.B) {
	setup(b)
	if out, err := smx("run", "--", "true"); err != nil {
		b.Fatal(err, out)
	}
	awaitSharedRAM(b)
	execTrue := func(c *sandbox.Client) time.Duration {
		start := time.Now()
		st, err := c.Exec(context.Background(), supproto.ExecRequest{Args: []string{"true"}}, sandbox.ExecIO{})
		if err != nil || st.Code != 0 {
			b.Fatal(err, st)
		}
		return time.Since(start)
	}
	var first, later time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		name := fmt.Sprintf("bench-first-exec-%d", i)
		smx("agent", "rm", "-f", name)
		if out, err := smx("agent", "create", name); err != nil {
			b.Fatal(err, out)
		}
		out, err := smx("agent", "start", name)
		if err != nil || !strings.Contains(out, "restored from template") {
			b.Fatalf("start: %v\n%s", err, out)
		}
		c := &sandbox.Client{Paths: (&sandbox.Manager{State: statedir.Dir{Root: home}}).Paths(name)}
		b.StartTimer()
		first += execTrue(c)
		for j := 0; j < 3; j++ {
			later += execTrue(c) / 3
		}
		b.StopTimer()
		smx("agent", "rm", "-f", name)
		b.StartTimer()
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(first.Seconds()*1000/n, "first-exec-ms")
	b.ReportMetric(later.Seconds()*1000/n, "later-exec-ms")
	b.ReportMetric(first.Seconds()/later.Seconds(), "first/later")
}

// BenchmarkIdleMemory reports the host memory of an idle sandbox beyond
// guest RAM: the supervisor's RSS, and QEMU's RSS next to the guest size.
func BenchmarkIdleMemory(b *testing.B) {
	setup(b)
	name := "bench-mem"
	smx("agent", "rm", "-f", name)
	if _, err := smx("agent", "create", name, "--memory", "512M"); err != nil {
		b.Fatal(err)
	}
	if _, err := smx("agent", "start", name); err != nil {
		b.Fatal(err)
	}
	defer smx("agent", "rm", "-f", name)
	m := &sandbox.Manager{State: statedir.Dir{Root: home}}
	for i := 0; i < b.N; i++ {
		time.Sleep(2 * time.Second)
	}
	in, err := m.Get(name)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(rssMiB(in.State.SupervisorPID), "supervisor-RSS-MiB")
	b.ReportMetric(rssMiB(in.State.QEMUPID), "qemu-RSS-MiB")
	b.ReportMetric(float64(in.Spec.MemoryMiB), "guest-RAM-MiB")
}

func rssMiB(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.Atoi(f[1])
			return float64(kb) / 1024
		}
	}
	return -1
}
