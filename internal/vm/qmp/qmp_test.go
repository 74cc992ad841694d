package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/testutil"
)

// startPaused runs a microvm that never boots (-S) so QMP can be tested
// without a kernel.
func startPaused(t *testing.T) (sock string, cmd *exec.Cmd) {
	qemu := testutil.QEMU(t)
	sock = filepath.Join(t.TempDir(), "qmp.sock")
	cmd = exec.Command(qemu, "-M", "microvm", "-accel", "tcg", "-S", "-nodefaults", "-no-user-config",
		"-display", "none", "-qmp", "unix:"+sock+",server=on,wait=off")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The file appears at bind, before listen: wait for a connection
		// to be accepted (QEMU takes the next client after this one).
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock, cmd
		}
		if time.Now().After(deadline) {
			t.Fatal("QMP socket did not listen within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type status struct {
	Status  string `json:"status"`
	Running bool   `json:"running"`
}

func TestClientAgainstQEMU(t *testing.T) {
	sock, cmd := startPaused(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var st status
	if err := c.Execute(ctx, "query-status", nil, &st); err != nil {
		t.Fatal(err)
	}
	if st.Status != "prelaunch" || st.Running {
		t.Fatalf("status = %+v, want prelaunch", st)
	}

	// A reply well over 64 KiB, which broke go-qemu.
	var schema []json.RawMessage
	if err := c.Execute(ctx, "query-qmp-schema", nil, &schema); err != nil {
		t.Fatal(err)
	}
	if len(schema) < 100 {
		t.Fatalf("schema has %d entries", len(schema))
	}

	err = c.Execute(ctx, "no-such-command", nil, nil)
	var qe *Error
	if !errors.As(err, &qe) || qe.Class != "CommandNotFound" || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown command: err = %v", err)
	}
	err = c.Execute(ctx, "device_del", map[string]string{"id": "nope"}, nil)
	if !errors.As(err, &qe) || qe.Desc == "" {
		t.Fatalf("device_del: err = %v", err)
	}

	if err := c.Execute(ctx, "cont", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Execute(ctx, "query-status", nil, &st); err != nil || !st.Running {
		t.Fatalf("after cont: %+v, %v", st, err)
	}
	if err := c.Execute(ctx, "stop", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Execute(ctx, "query-status", nil, &st); err != nil || st.Status != "paused" {
		t.Fatalf("after stop: %+v, %v", st, err)
	}
	// stop and cont emit STOP/RESUME events; they must have been delivered
	// without disturbing the replies above.
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case ev := <-c.Events():
			got[ev.Name] = true
		case <-ctx.Done():
			t.Fatalf("events seen: %v", got)
		}
	}
	if !got["STOP"] || !got["RESUME"] {
		t.Fatalf("events = %v", got)
	}

	if err := c.Execute(ctx, "quit", nil, nil); err != nil && !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("connection not closed after quit")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("qemu exit: %v", err)
	}
	if err := c.Execute(ctx, "query-status", nil, nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("after quit: err = %v", err)
	}
}

func TestConcurrentExecute(t *testing.T) {
	sock, _ := startPaused(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	errc := make(chan error, 8)
	for range 8 {
		go func() {
			var st status
			for range 20 {
				if err := c.Execute(ctx, "query-status", nil, &st); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range 8 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
}

func TestDialNotQMP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := Dial(ctx, filepath.Join(t.TempDir(), "missing.sock")); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
}

// TestExecuteFD passes a file to QEMU with getfd and migrates a paused
// machine into it: the path snapshots take, since QEMU's seccomp sandbox
// forbids exec: migration.
func TestExecuteFD(t *testing.T) {
	sock, _ := startPaused(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "state"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := c.ExecuteFD(ctx, "getfd", map[string]string{"fdname": "st"}, f, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Execute(ctx, "migrate", map[string]string{"uri": "fd:st"}, nil); err != nil {
		t.Fatal(err)
	}
	for {
		var mi struct {
			Status string `json:"status"`
		}
		if err := c.Execute(ctx, "query-migrate", nil, &mi); err != nil {
			t.Fatal(err)
		}
		if mi.Status == "completed" {
			break
		}
		if mi.Status == "failed" || ctx.Err() != nil {
			t.Fatalf("migration %s", mi.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	fi, _ := f.Stat()
	if fi.Size() == 0 {
		t.Fatal("no state written")
	}
	if err := c.ExecuteFD(ctx, "getfd", nil, nil, nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("nil file: %v", err)
	}
}
