package service

import (
	"context"
	"testing"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/sandbox"
)

// A sandbox that takes the name of a removed one is not shown its
// refusals: the log keeps the name (and `smx agent logs` still shows the
// removed sandbox's records), but `agent ls` counts only the new
// sandbox's own, from its sandbox.create on, told by its ID.
func TestReusedNameRefusals(t *testing.T) {
	s := newTestService(t)
	ctx := context.Background()
	refusals := func() int64 {
		t.Helper()
		list, err := s.List(ctx)
		if err != nil || len(list) != 1 {
			t.Fatalf("list: %v, %v", list, err)
		}
		return list[0].Refusals
	}
	create := func() sandbox.Spec {
		t.Helper()
		record(t, s, "x", sandbox.StatusStopped)
		in, err := s.manager().Get("x")
		if err != nil {
			t.Fatal(err)
		}
		if len(in.Spec.ID) != 32 {
			t.Fatalf("sandbox id %q", in.Spec.ID)
		}
		s.logEvent(ctx, "x", audit.KindSandboxCreate, in.Spec.CreateFields())
		return in.Spec
	}
	first := create()
	s.logEvent(ctx, "x", audit.KindNetRefused, map[string]any{"host": "old.example", "rule": "network.mode"})
	if n := refusals(); n != 1 {
		t.Fatalf("first sandbox: %d refusals, want 1", n)
	}
	if err := s.Remove(ctx, RemoveRequest{Name: "x"}); err != nil {
		t.Fatal(err)
	}
	second := create()
	if second.ID == first.ID {
		t.Fatalf("both sandboxes have id %s", first.ID)
	}
	if n := refusals(); n != 0 {
		t.Fatalf("the new sandbox x is shown %d refusals of the removed one", n)
	}
	s.logEvent(ctx, "x", audit.KindFileRefused, map[string]any{"path": "/work/.env"})
	if n := refusals(); n != 1 {
		t.Fatalf("the new sandbox's own refusal: %d, want 1", n)
	}
	// The log itself keeps both, under the name.
	all, err := audit.Read(audit.Dir(s.state.Logs(), "x"), audit.Filter{Refusals: true})
	if err != nil || len(all) != 2 {
		t.Fatalf("the log has %d refusals, %v; want both sandboxes' 2", len(all), err)
	}
}
