package service

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/supproto"
)

// A state the supervisor cannot write fails the operation that moved it,
// instead of being logged while the sandbox's record says otherwise; the
// supervisor keeps the change it made, so the next operation goes on
// from there once the state can be written again. And the supervisor
// checks the table itself for what it serves: an exec on a paused
// sandbox is refused in the table's words even when it reaches the
// supervisor past the service.
func TestStateWriteFailsOperation(t *testing.T) {
	s := vmService(t)
	ctx := context.Background()
	const name = "unwritable"
	if _, err := s.Create(ctx, CreateRequest{Name: name, Memory: "256M"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Start(ctx, StartRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	p := s.manager().Paths(name)
	c := &sandbox.Client{Paths: p}
	// state.json replaced by a directory with something in it: the
	// atomic rename onto it fails, for root too.
	if err := os.Remove(p.State()); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(p.State(), "in-the-way"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx); err == nil || !strings.Contains(err.Error(), "write state") {
		t.Fatalf("pause with an unwritable state: %v, want it to fail saying the state could not be written", err)
	}
	// The guest is paused all the same, and the supervisor knows it.
	_, err := c.Exec(ctx, supproto.ExecRequest{Args: []string{"true"}}, sandbox.ExecIO{})
	if !errors.Is(err, errdefs.ErrFailed) || !strings.Contains(err.Error(), "sandbox unwritable is paused: resume it") {
		t.Fatalf("exec on the paused sandbox, past the service: %v", err)
	}
	if err := os.RemoveAll(p.State()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx); err != nil {
		t.Fatalf("resume once the state can be written: %v", err)
	}
	if in, err := s.Inspect(ctx, name); err != nil || in.State.Status != sandbox.StatusRunning {
		t.Fatalf("after resume: %+v, %v", in, err)
	}
	if _, code := execOut(t, s, name, "true"); code != 0 {
		t.Fatalf("exec after resume: %d", code)
	}
	if _, err := s.Stop(ctx, StopRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	if in, err := s.Inspect(ctx, name); err != nil || in.State.Status != sandbox.StatusStopped {
		t.Fatalf("after stop: %+v, %v", in, err)
	}
}
