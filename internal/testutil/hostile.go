package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// HostileAgent builds smx-agent with the smxhostile tag and returns its
// path (for SMX_AGENT). That agent answers a copy out of P with the raw
// bytes of P.hostile-tar when the file exists: the guest whose root
// replaced the agent, which every host-side check must assume.
func HostileAgent(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "smx-agent")
	cmd := exec.Command("go", "build", "-tags", "smxhostile", "-trimpath", "-ldflags=-s -w", "-o", p, "./cmd/smx-agent")
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the hostile agent: %v\n%s", err, out)
	}
	return p
}
