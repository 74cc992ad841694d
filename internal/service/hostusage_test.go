package service

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/sandbox"
)

// TestHostUsage reads a live process's CPU time and memory from /proc, and
// nothing for a PID that another program now holds.
func TestHostUsage(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	run := func(name string) int {
		dst := filepath.Join(t.TempDir(), name)
		src, err := os.Open(sleep)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, src); err != nil {
			t.Fatal(err)
		}
		out.Close()
		cmd := exec.Command(dst, "30")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd.Process.Pid
	}
	live := func(pid int) sandbox.Info {
		var in sandbox.Info
		in.State.Status = sandbox.StatusRunning
		in.State.Started = time.Now().Add(-time.Minute)
		in.State.QEMUPID = pid
		return in
	}
	qemu := run("qemu-system-x86_64")
	time.Sleep(50 * time.Millisecond) // exec done: comm is the new program's
	if cpu, rss := HostUsage(live(qemu)); cpu < 0 || rss <= 0 {
		t.Errorf("usage of a live qemu: cpu %v s, rss %d bytes; want rss > 0", cpu, rss)
	}
	other := run("sleep")
	time.Sleep(50 * time.Millisecond)
	if cpu, rss := HostUsage(live(other)); cpu != 0 || rss != 0 {
		t.Errorf("usage of a PID another program holds: %v s, %d bytes; want nothing", cpu, rss)
	}
	stopped := live(qemu)
	stopped.State.Status = sandbox.StatusStopped
	if cpu, rss := HostUsage(stopped); cpu != 0 || rss != 0 {
		t.Errorf("usage of a stopped sandbox: %v s, %d bytes; want nothing", cpu, rss)
	}
}
