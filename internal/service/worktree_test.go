package service

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/testutil"
)

// TestWorktreeLifecycle: --worktree makes a worktree on agent/NAME from
// the repository's HEAD, reuses it, refuses a folder whose gitfile points
// elsewhere, keeps a dirty worktree and removes a clean one (the branch
// stays). The host's git runs none of the repository's hooks or
// fsmonitor while doing so.
func TestWorktreeLifecycle(t *testing.T) {
	testutil.RequireGit(t)
	s := newTestService(t)
	ctx := context.Background()
	repo := t.TempDir()
	testutil.Git(t, repo, "init", "--quiet", "-b", "main")
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("a\n"), 0o644)
	testutil.Git(t, repo, "add", "a.txt")
	testutil.Git(t, repo, "commit", "--quiet", "-m", "one")
	head := testutil.Git(t, repo, "rev-parse", "HEAD")
	// What a hostile repository config or hook would run.
	marker := filepath.Join(t.TempDir(), "ran")
	script := "#!/bin/sh\necho ran >> " + marker + "\n"
	for _, h := range []string{"post-checkout", "reference-transaction", "pre-commit"} {
		os.WriteFile(filepath.Join(repo, ".git/hooks", h), []byte(script), 0o755)
	}
	fsmon := filepath.Join(t.TempDir(), "fsmon")
	os.WriteFile(fsmon, []byte(script), 0o755)
	testutil.Git(t, repo, "config", "core.fsmonitor", fsmon)

	wt, err := s.prepareWorktree(ctx, filepath.Join(repo, "."), "a1", "")
	if err != nil {
		t.Fatal(err)
	}
	if wt.Branch != "agent/a1" || wt.Name != "a1" || wt.GitDir != filepath.Join(repo, ".git") || !strings.HasPrefix(wt.Path, s.state.Root) {
		t.Fatalf("worktree %+v", wt)
	}
	if got := testutil.Git(t, repo, "rev-parse", "agent/a1"); got != head {
		t.Errorf("agent/a1 at %s, want HEAD %s", got, head)
	}
	if b, err := os.ReadFile(filepath.Join(wt.Path, "a.txt")); err != nil || string(b) != "a\n" {
		t.Errorf("checkout: %q %v", b, err)
	}
	again, err := s.prepareWorktree(ctx, repo, "a1", "")
	if err != nil || *again != *wt {
		t.Fatalf("reuse: %+v %v", again, err)
	}
	dir := t.TempDir()
	wt2, err := s.prepareWorktree(ctx, repo, "a2", dir)
	if err != nil || wt2.Path != filepath.Join(dir, "a2") {
		t.Fatalf("--worktree-dir: %+v %v", wt2, err)
	}
	for _, bad := range []string{"", "-x", "a..b", "x.lock", "a/b", "x."} {
		if _, err := s.prepareWorktree(ctx, repo, bad, ""); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("--worktree %q: %v", bad, err)
		}
	}
	// A folder whose gitfile points at another git dir (one the guest
	// could have made) is not taken for the worktree.
	os.MkdirAll(filepath.Join(dir, "a3"), 0o755)
	os.WriteFile(filepath.Join(dir, "a3", ".git"), []byte("gitdir: "+dir+"/evil\n"), 0o644)
	if _, err := s.prepareWorktree(ctx, repo, "a3", dir); !errors.Is(err, errdefs.ErrExists) {
		t.Errorf("foreign gitfile: %v", err)
	}

	// Dirty: kept, and why.
	os.WriteFile(filepath.Join(wt.Path, "new.txt"), []byte("x"), 0o644)
	r, err := s.RemoveWorktree(ctx, wt)
	if err != nil || r.Removed || !strings.Contains(r.Reason, "1 uncommitted change") {
		t.Fatalf("dirty: %+v %v", r, err)
	}
	if _, err := os.Stat(wt.Path); err != nil {
		t.Fatal("dirty worktree removed")
	}
	os.Remove(filepath.Join(wt.Path, "new.txt"))
	r, err = s.RemoveWorktree(ctx, wt)
	if err != nil || !r.Removed {
		t.Fatalf("clean: %+v %v", r, err)
	}
	if _, err := os.Stat(wt.Path); !os.IsNotExist(err) {
		t.Errorf("clean worktree still there: %v", err)
	}
	if got := testutil.Git(t, repo, "rev-parse", "agent/a1"); got != head {
		t.Errorf("branch agent/a1 gone after removal: %s", got)
	}
	// The branch is taken up again by a new worktree of that name.
	if wt, err = s.prepareWorktree(ctx, repo, "a1", ""); err != nil {
		t.Fatalf("again after removal: %v", err)
	}
	if b, err := os.ReadFile(marker); err == nil {
		t.Errorf("the repository's hooks or fsmonitor ran on the host: %q", b)
	}
}
