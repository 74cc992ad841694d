package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestHostDiskFull fills the host filesystem under a sandbox's disk: QEMU
// stops the guest, and smx must say so (blocked, where, logged), refuse
// new execs, let a waiting exec be interrupted, refuse to resume while the
// disk is still full, and resume once space is freed (issue 9, item 5).
func TestHostDiskFull(t *testing.T) {
	testutil.RequireQEMU(t)
	testutil.Require(t, os.Geteuid() == 0, "root (the test mounts a small tmpfs as the state directory)", "run the test as root")
	bin := testutil.Binaries(t)
	home := t.TempDir()
	if err := unix.Mount("tmpfs", home, "tmpfs", 0, "size=200m"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	v := &vmEnv{t: t, bin: bin, home: home, name: "full"}
	t.Cleanup(func() {
		if t.Failed() {
			// What the supervisor saw, for a failure that does not reproduce.
			sup, _ := os.ReadFile(filepath.Join(home, "sandboxes", v.name, "supervisor.log"))
			t.Logf("supervisor.log:\n%s", sup)
			logs, _ := v.smx("agent", "logs", v.name)
			t.Logf("agent logs:\n%s", logs)
		}
		v.smx("agent", "rm", "-f", v.name)
		if err := unix.Unmount(home, unix.MNT_DETACH); err != nil {
			t.Errorf("umount: %v", err)
		}
	})
	if err := os.Symlink(testutil.KernelCache(t), filepath.Join(home, "kernels")); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"image", "build", "busybox", "--from", "busybox"},
		{"agent", "create", v.name},
		{"agent", "start", v.name},
	} {
		if out, err := v.smx(args...); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	// Leave about 16 MiB free; the guest then writes 64.
	var st unix.Statfs_t
	if err := unix.Statfs(home, &st); err != nil {
		t.Fatal(err)
	}
	ballast := filepath.Join(home, "ballast")
	if out, err := exec.Command("fallocate", "-l", itoa(int64(st.Bavail)*st.Bsize-16<<20), ballast).CombinedOutput(); err != nil {
		t.Fatalf("fallocate: %v\n%s", err, out)
	}

	dd := v.cmd("agent", "exec", v.name, "--", "dd", "if=/dev/zero", "of=/root/big", "bs=1M", "count=64", "conv=fsync")
	var ddErr syncBuf
	dd.Stderr = &ddErr
	if err := dd.Start(); err != nil {
		t.Fatal(err)
	}
	ddDone := make(chan error, 1)
	go func() { ddDone <- dd.Wait() }()
	v.waitFor("inspect", 180*time.Second, func() bool {
		out, _ := v.smx("agent", "inspect", v.name)
		return strings.Contains(out, "Status:   blocked")
	})
	out, _ := v.smx("agent", "inspect", v.name)
	if !strings.Contains(out, "host disk full at "+filepath.Join(home, "sandboxes", v.name)) {
		t.Errorf("inspect does not say where the disk is full:\n%s", out)
	}
	if out, _ := v.smx("agent", "ls"); !strings.Contains(out, "blocked") {
		t.Errorf("ls:\n%s", out)
	}
	if out, _ := v.smx("agent", "logs", v.name); !strings.Contains(out, "sandbox.blocked") || !strings.Contains(out, "nospace=true") {
		t.Errorf("no sandbox.blocked record:\n%s", out)
	}
	if out, err := v.smx("agent", "exec", v.name, "--", "true"); err == nil || !strings.Contains(out, "is blocked: host disk full") {
		t.Errorf("exec into a blocked sandbox: %v\n%s", err, out)
	}

	// The first interrupt of the exec waiting on the stopped guest says at
	// once why nothing happens and what a second one does; the second
	// ends the wait.
	dd.Process.Signal(syscall.SIGINT)
	v.waitFor("the first interrupt's notice", 5*time.Second, func() bool {
		return strings.Contains(ddErr.String(), "sandbox "+v.name+" is blocked (host disk full at ")
	})
	if out := ddErr.String(); !strings.Contains(out, "dd gets the interrupt only once it resumes; Ctrl-C again stops waiting") {
		t.Errorf("first interrupt's notice:\n%s", out)
	}
	dd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-ddDone:
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
			t.Errorf("interrupted exec: %v, want exit 130", err)
		}
	case <-time.After(60 * time.Second):
		dd.Process.Kill()
		t.Fatal("exec into a blocked sandbox ignored two interrupts")
	}

	if out, err := v.smx("agent", "resume", v.name); err == nil || !strings.Contains(out, "still blocked") {
		t.Errorf("resume with the disk still full: %v\n%s", err, out)
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if out, err := v.smx("agent", "resume", v.name); err != nil || !strings.Contains(out, "running") {
		t.Fatalf("resume after freeing space: %v\n%s", err, out)
	}
	if out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", "dd if=/dev/zero of=/root/more bs=1M count=8 conv=fsync && echo written"); err != nil || !strings.Contains(out, "written") {
		t.Fatalf("guest after resume: %v\n%s", err, out)
	}
	if out, _ := v.smx("agent", "logs", v.name); !strings.Contains(out, `from="blocked"`) {
		t.Errorf("no resume record:\n%s", out)
	}
}

// syncBuf is a strings.Builder safe for a writer and a reader at once.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// waitFor polls cond until it holds or d passes.
func (v *vmEnv) waitFor(what string, d time.Duration, cond func() bool) {
	v.t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			v.t.Fatalf("%s: condition not met after %s", what, d)
		}
		time.Sleep(300 * time.Millisecond)
	}
}
