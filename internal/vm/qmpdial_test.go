package vm

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

// A QMP dial that keeps retrying (QEMU slow to create its socket) must
// not hold the machine's mutex: another caller with a shorter deadline
// gets its own error when its deadline passes, and ReleaseQMP and Close
// return, while the dial goes on.
func TestQMPDialDoesNotHoldTheMutex(t *testing.T) {
	m := &Machine{
		qmpPath:  filepath.Join(t.TempDir(), "qmp.sock"), // never created
		log:      slog.New(slog.DiscardHandler),
		done:     make(chan struct{}),
		stopping: make(chan struct{}),
	}
	long, cancelLong := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { _, err := m.QMP(long); first <- err }()
	// Let the first caller start dialing.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		m.mu.Lock()
		d := m.dialing != nil
		m.mu.Unlock()
		if d {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first QMP call never started dialing")
		}
	}
	returned := func(what string, f func() error) error {
		t.Helper()
		ch := make(chan error, 1)
		go func() { ch <- f() }()
		select {
		case err := <-ch:
			return err
		case <-time.After(30 * time.Second):
			t.Fatalf("%s is stuck behind the dial in progress", what)
			return nil
		}
	}
	err := returned("a second QMP call", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := m.QMP(ctx)
		return err
	})
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("second QMP call: %v, want its own deadline, unavailable", err)
	}
	returned("ReleaseQMP", func() error { m.ReleaseQMP(); return nil })
	select {
	case err := <-first:
		t.Fatalf("the first dial ended early: %v", err)
	default:
	}
	cancelLong()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("first QMP call after cancel: %v", err)
	}
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	if _, err := m.QMP(context.Background()); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("QMP after Close: %v", err)
	}
}
