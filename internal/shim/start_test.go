package shim

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/namespaces"
	cshim "github.com/containerd/containerd/runtime/v2/shim"
)

// daemonEnv makes this test binary stand in for the shim daemon that
// StartShim starts (os.Executable is the test binary here): it writes its
// PID and holds its listening socket (fd 3) until killed.
const daemonEnv = "SMX_TEST_SHIM_DAEMON"

func TestMain(m *testing.M) {
	if os.Getenv(daemonEnv) == "1" {
		os.WriteFile("daemon.pid", []byte(strconv.Itoa(os.Getpid())), 0o600)
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestStartShimOutlivesStart: containerd's `start` command cancels its
// context as it returns (the shim library's deferred shutdown), so the
// daemon StartShim leaves behind must not be tied to that context. A CI
// run once lost the race: the daemon was killed before containerd dialled
// it ("connect: connection refused").
func TestStartShimOutlivesStart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the shim's sockets live in /run/containerd/s: run as root")
	}
	t.Setenv(daemonEnv, "1")
	bundle := t.TempDir()
	t.Chdir(bundle)
	ctx, cancel := context.WithCancel(namespaces.WithNamespace(context.Background(), "smx-test"))
	address, err := (&Shim{}).StartShim(ctx, cshim.StartOpts{
		ID:           fmt.Sprintf("start-%d", os.Getpid()),
		Address:      filepath.Join(bundle, "containerd.sock"),
		TTRPCAddress: filepath.Join(bundle, "containerd.sock.ttrpc"),
	})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cshim.RemoveSocket(address) })
	var pid int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile("daemon.pid")
		if pid, _ = strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatal("the daemon never started")
		}
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	cancel() // what the start command does as it returns
	time.Sleep(300 * time.Millisecond)
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("the shim daemon died with its start command's context: %v", err)
	}
	if b, _ := os.ReadFile("address"); string(b) != address {
		t.Errorf("address file %q, want %q", b, address)
	}
}
