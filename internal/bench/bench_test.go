// Package bench measures smx side by side with its nearest peer run in the
// same process: bare QEMU booting the same kernel. Run with
//
//	go test -run '^$' -bench . -benchtime 5x ./internal/bench/
//
// and compare ns/op between sub-benchmarks of the same group.
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

	"smx/internal/agentproto"
	"smx/internal/initramfs"
	"smx/internal/kernel"
	"smx/internal/sandbox"
	"smx/internal/statedir"
	"smx/internal/testutil"
	"smx/internal/vm"
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

func smx(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(bin, "smx"), args...)
	cmd.Env = append(os.Environ(), "SMX_HOME="+home)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("smx %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// BenchmarkColdStart compares `smx run -- true` end to end (CLI, supervisor,
// boot or template restore, agent, exec, teardown) with bare QEMU booting
// the same kernel with an initramfs whose init powers off at once: cold
// (module loading, root switch) and from a boot template.
func BenchmarkColdStart(b *testing.B) {
	setup(b)
	b.Run("bare-qemu", func(b *testing.B) {
		k, err := kernel.Find(filepath.Join(home, "kernels"))
		if err != nil {
			b.Fatal(err)
		}
		initrd := bareInitramfs(b)
		accel, _ := vm.DetectAccel()
		for i := 0; i < b.N; i++ {
			cfg := vm.Config{
				Accel: accel, CPUs: 1, MemoryMiB: 512,
				Kernel: k.BootImage(), Initrd: initrd,
				Cmdline:   "console=ttyS0 panic=-1 quiet loglevel=3",
				Devices:   []vm.Device{vm.Console{LogPath: filepath.Join(b.TempDir(), "console.log")}},
				QMPSocket: filepath.Join(b.TempDir(), "qmp.sock"),
			}
			m, err := vm.Start(context.Background(), cfg, nil)
			if err != nil {
				b.Fatal(err)
			}
			m.Wait()
			m.Close()
		}
	})
	// --cold: boot every time, as before boot templates.
	b.Run("smx-run-cold", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if out, err := smx("run", "--cold", "--", "true"); err != nil {
				b.Fatal(err, out)
			}
		}
	})
	// The default: the first run of this machine shape saved a boot
	// template (done before the timer starts); each run restores it.
	b.Run("smx-run-template", func(b *testing.B) {
		if out, err := smx("run", "--", "true"); err != nil {
			b.Fatal(err, out)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if out, err := smx("run", "--", "true"); err != nil {
				b.Fatal(err, out)
			}
		}
	})
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
			st, err := c.Exec(context.Background(), agentproto.ExecRequest{Args: []string{"true"}}, sandbox.ExecIO{})
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
