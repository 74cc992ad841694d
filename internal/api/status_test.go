package api

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
)

// TestStatusOf: each errdefs class has its HTTP status, also when the
// class came across the supervisor's socket.
func TestStatusOf(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
	}{
		{fmt.Errorf("sandbox x: %w", errdefs.ErrNotFound), 404},
		{fmt.Errorf("bad: %w", errdefs.ErrInvalid), 400},
		{fmt.Errorf("dup: %w", errdefs.ErrExists), 409},
		{fmt.Errorf("busy: %w", errdefs.ErrInUse), 409},
		{fmt.Errorf("state: %w", errdefs.ErrFailed), 412},
		{fmt.Errorf("qemu: %w", errdefs.ErrUnavailable), 503},
		{fmt.Errorf("policy: %w", errdefs.ErrDenied), 403},
		{&http.MaxBytesError{Limit: 1}, 413},
		{errors.New("boom"), 500},
		{fmt.Errorf("supervisor: %w", &agentproto.Error{Message: "sandbox is paused", Class: "failed_precondition"}), 412},
	} {
		if got := StatusOf(ClassOf(c.err)); got != c.status {
			t.Errorf("%v: status %d, want %d", c.err, got, c.status)
		}
	}
	// The API's class names are errdefs' own.
	for _, name := range errdefs.Classes() {
		if got := ClassOf(errdefs.FromClass(name)); got != name {
			t.Errorf("class %s reads %s in the API", name, got)
		}
	}
	s := &Server{}
	if b := s.errorBody(&StartError{ExitCode: 127, Message: "x: not found"}); b.ExitCode != 127 || StatusOf(b.Class) != 412 {
		t.Errorf("start error: %+v", b)
	}
	if m := Message(fmt.Errorf("sandbox x is paused: resume it: %w", errdefs.ErrFailed)); m != "sandbox x is paused: resume it" {
		t.Errorf("message %q", m)
	}
}
