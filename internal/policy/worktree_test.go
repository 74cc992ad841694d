package policy

import "testing"

// A worktree sandbox may write only its own branch in the shared git dir
// and push only that branch; everything the profile allowed before stays
// allowed only within that, and the built-in protection still holds.
func TestWorktreeNarrows(t *testing.T) {
	p, err := Parse("wt.yaml", []byte(`files:
  rules:
    - path: /**
      access: rw
git:
  repos:
    - repo: forge.test/**
      read: allow
      push: allow
      delete: allow
      force_push: allow
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	const gd = "/home/u/repo/.git"
	p.Worktree(gd, "a1", "agent/a1")
	for _, c := range []struct {
		path, access string
		allow        bool
	}{
		{gd + "/objects/ab/cdef", "rw", true},
		{gd + "/objects/pack/tmp_pack_x", "rw", true},
		{gd + "/refs/heads/agent/a1", "rw", true},
		{gd + "/refs/heads/agent/a1.lock", "rw", true},
		{gd + "/logs/refs/heads/agent/a1", "rw", true},
		{gd + "/worktrees/a1/HEAD", "rw", true},
		{gd + "/refs/remotes/origin/agent/a1", "rw", true},
		{gd + "/refs/remotes/origin/agent/a1.lock", "rw", true},
		{gd + "/logs/refs/remotes/origin/agent/a1", "rw", true},
		{gd + "/refs/remotes/origin/main", "rw", false},
		{gd + "/refs/remotes/origin/agent/a2", "rw", false},
		{gd + "/worktrees/a1/index.lock", "rw", true},
		{gd + "/HEAD", "ro", true},
		{gd + "/refs/heads/main", "ro", true},
		// The other branches, the other worktrees, the repository's
		// own HEAD and index: read-only though the profile says /** rw.
		{gd + "/refs/heads/main", "rw", false},
		{gd + "/refs/heads/agent/a2", "rw", false},
		{gd + "/refs/heads/agent/a1x", "rw", false},
		{gd + "/packed-refs", "rw", false},
		{gd + "/HEAD", "rw", false},
		{gd + "/index", "rw", false},
		{gd + "/worktrees/a2/HEAD", "rw", false},
		{gd + "/logs/refs/heads/main", "rw", false},
		// Protected whatever the worktree rules say.
		{gd + "/config", "rw", false},
		{gd + "/hooks/pre-commit", "rw", false},
		{gd + "/worktrees/a1/commondir", "rw", false},
		{gd + "/worktrees/a1/config.worktree", "rw", false},
		{"/work/.git", "rw", false},
		// Elsewhere the profile's rules are unchanged.
		{"/work/src/main.go", "rw", true},
	} {
		d := p.Decide(Request{Kind: KindFile, Path: c.path, Access: c.access})
		if d.Allow != c.allow {
			t.Errorf("%s %s: allow=%v (%s: %s), want %v", c.access, c.path, d.Allow, d.Rule, d.Reason, c.allow)
		}
	}
	for _, c := range []struct {
		access, repo, ref string
		allow             bool
	}{
		{"push", "forge.test/acme/app", "refs/heads/agent/a1", true},
		{"force-push", "forge.test/acme/app", "refs/heads/agent/a1", true},
		{"push", "forge.test/acme/app", "refs/heads/main", false},
		{"push", "forge.test/acme/app", "refs/heads/agent/a2", false},
		{"push", "forge.test/acme/app", "refs/heads/agent/a1/x", false},
		{"push", "forge.test/acme/app", "refs/tags/v1", false},
		{"delete", "forge.test/acme/app", "refs/heads/agent/a2", false},
		{"push", "forge.test/acme/other", "refs/heads/main", false},
		{"read", "forge.test/acme/app", "", true},
		// Narrowing grants nothing the profile did not.
		{"push", "github.com/acme/app", "refs/heads/agent/a1", false},
	} {
		d := p.Decide(Request{Kind: KindGit, Repo: c.repo, Access: c.access, Ref: c.ref})
		if d.Allow != c.allow {
			t.Errorf("%s %s %s: allow=%v (%s: %s), want %v", c.access, c.repo, c.ref, d.Allow, d.Rule, d.Reason, c.allow)
		}
		if !c.allow && c.repo == "forge.test/acme/app" && d.Rule != "worktree agent/a1: pushes only refs/heads/agent/a1" {
			t.Errorf("%s %s: rule %q", c.access, c.ref, d.Rule)
		}
	}
}
