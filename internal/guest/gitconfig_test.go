package guest

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestGitConfig(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, SystemGitConfig)
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte("[core]\n\teditor = vi\n"), 0o644)
	b := &Boot{Log: slog.New(slog.DiscardHandler)}
	for range 2 { // a second boot replaces the block
		if err := (GitConfig{Root: root}).Run(b); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(p)
	if !strings.HasPrefix(string(got), "[core]\n\teditor = vi\n") || strings.Count(string(got), gitBegin) != 1 {
		t.Fatalf("%s =\n%s", SystemGitConfig, got)
	}
	// git reads it as meant.
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	for key, want := range map[string]string{"push.default": "current", "branch.autosetupmerge": "false", "repack.updateserverinfo": "false", "core.editor": "vi"} {
		out, err := exec.Command("git", "config", "--file", p, "--get", key).Output()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("git config %s = %q, %v; want %s", key, out, err, want)
		}
	}
}
