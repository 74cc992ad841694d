package supervisor

import (
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/statedir"
)

// smx-why tells the agent only its own sandbox's refusals: a removed
// sandbox of the same name wrote to the same log, and what it was refused
// is not this agent's to learn.
func TestWhyOwnRefusals(t *testing.T) {
	st := statedir.Dir{Root: t.TempDir()}
	k, err := audit.LoadOrCreateKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	write := func(kind string, f map[string]any) {
		t.Helper()
		l, err := audit.Open(audit.Dir(st.Logs(), "x"), "x", k.Signer())
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if _, err := l.Append(t.Context(), kind, f); err != nil {
			t.Fatal(err)
		}
	}
	write(audit.KindSandboxCreate, map[string]any{"sandbox_id": "0ld"})
	write(audit.KindGitRefused, map[string]any{"repo": "forge.test/acme/secret-of-the-old-one", "rule": "old.yaml:1:1 git"})
	write(audit.KindSandboxRemove, nil)
	time.Sleep(2 * time.Millisecond)
	s := &Supervisor{opts: Options{State: st, Name: "x"}, self: audit.Identity{ID: "n3w", Created: time.Now()}}
	if got := s.scanWhy(); !strings.HasPrefix(got, "No refusals in this sandbox so far.") {
		t.Fatalf("before its own create, smx-why says:\n%s", got)
	}
	write(audit.KindSandboxCreate, map[string]any{"sandbox_id": "n3w"})
	write(audit.KindNetRefused, map[string]any{"host": "mine.example", "rule": "new.yaml:2:3 network.mode"})
	got := s.scanWhy()
	if strings.Contains(got, "secret-of-the-old-one") || !strings.Contains(got, "host=mine.example") ||
		!strings.Contains(got, "The 1 most recent refusals") {
		t.Fatalf("smx-why says:\n%s", got)
	}
}
