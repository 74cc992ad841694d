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
)

// TestExplainSandbox decides against the profile frozen into a sandbox,
// the one its gateways enforce, not the file as it reads now.
func TestExplainSandbox(t *testing.T) {
	s := newTestService(t)
	ctx := context.Background()
	record(t, s, "frozen", sandbox.StatusStopped)
	file := filepath.Join(t.TempDir(), "team.yaml")
	deny := "extends: dev\nnetwork:\n  mode: default-deny\n  deny:\n    - cidr: 192.0.2.0/24\n"
	if err := os.WriteFile(file, []byte(deny), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.SetPolicy(ctx, PolicyRequest{Name: "frozen", Profile: file}); err != nil {
		t.Fatal(err)
	}
	// The file changes after the freeze: the sandbox does not follow.
	if err := os.WriteFile(file, []byte("extends: open\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const req = "tcp:192.0.2.10:5432"
	x, err := s.ExplainProfile(ctx, ExplainRequest{Sandbox: "frozen", Request: req})
	if err != nil || x.Allow || !strings.Contains(x.Rule, file+":5:7 network.deny[0]") {
		t.Fatalf("explain against the sandbox: %+v %v; want deny by %s:5:7 network.deny[0]", x, err, file)
	}
	if x, err := s.ExplainProfile(ctx, ExplainRequest{Profile: file, Request: req}); err != nil || !x.Allow {
		t.Fatalf("explain against the file as it is now: %+v %v; want allow", x, err)
	}
	doc, err := s.SandboxProfile(ctx, "frozen")
	if err != nil || !strings.Contains(doc.YAML, "192.0.2.0/24") || doc.Source != file {
		t.Fatalf("SandboxProfile: %+v %v; want the frozen copy from %s", doc, err, file)
	}
	if _, err := s.SandboxProfile(ctx, "nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("profile of a missing sandbox: %v, want not found", err)
	}
	if _, err := s.ExplainProfile(ctx, ExplainRequest{Sandbox: "../frozen", Request: req}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("explain with a path for a sandbox name: %v, want invalid", err)
	}
}
