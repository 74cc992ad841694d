package cli_test

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestWorktreeAgentRun: `smx agent run claude REPO --worktree w1` (as
// root, on a checkout that belongs to a user, as under sudo) mounts the
// worktree at /work for the preset's unprivileged user, who commits there
// (the commit is on agent/w1 in the host repository at once) and pushes
// agent/w1 and nothing else; `agent ls` shows the branch. Under root the
// worktree's git dir that `git worktree add` made is chowned to the
// checkout's owner (else git in the guest calls it dubious).
func TestWorktreeAgentRun(t *testing.T) {
	w := newAgentWorld(t, "claude", "api.anthropic.com", http.NotFoundHandler(), false)
	// An agent that waits, so the test can act as it in its sandbox.
	w.overridePreset("command: [claude, --dangerously-skip-permissions]", "command: [sleep, \"900\"]")
	c := w.cmdEnv("agent", "run", "claude", w.work, "-d", "--name", w.name, "--profile", w.profile, "--worktree", "w1")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("agent run --worktree: %v\n%s", err, out)
	}
	script := `cd /work && id -un && git config --global user.name agent && git config --global user.email agent@example.test
echo BRANCH=$(git rev-parse --abbrev-ref HEAD)
echo w1 > w1.txt && git add w1.txt && git commit -qm "work of w1" && echo COMMIT-OK
git push -q origin agent/w1 && echo PUSH-OK
git push origin HEAD:refs/heads/feature 2>&1; echo PUSH-FEATURE-RC=$?
`
	o, err := w.smx("agent", "exec", "-u", "user", w.name, "--", "sh", "-c", "HOME=/home/user; export HOME; stat -c '%u:%g %n' /work /work/.git /work/README.md "+filepath.Join(w.work, ".git")+" "+filepath.Join(w.work, ".git/worktrees/w1")+"; "+script)
	if err != nil {
		t.Fatalf("exec: %v\n%s", err, o)
	}
	for _, want := range []string{"user\n", "BRANCH=agent/w1", "COMMIT-OK", "PUSH-OK", "PUSH-FEATURE-RC=1",
		"(worktree agent/w1: pushes only refs/heads/agent/w1, profile ",
		// The worktree's git dir is the agent's too (made by root here).
		"1000:1000 " + filepath.Join(w.work, ".git/worktrees/w1")} {
		if !strings.Contains(o, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Fatalf("guest output:\n%s", o)
	}
	if msg := testutil.Git(t, w.work, "-c", "safe.directory=*", "log", "-1", "--format=%s", "agent/w1"); msg != "work of w1" {
		t.Errorf("host agent/w1 at %q", msg)
	}
	if msg := testutil.Git(t, filepath.Join(w.forge.Root, "acme/app.git"), "log", "-1", "--format=%s", "agent/w1"); msg != "work of w1" {
		t.Errorf("forge agent/w1 at %q", msg)
	}
	ls, _ := w.smx("agent", "ls")
	if !strings.Contains(ls, "(agent/w1)") {
		t.Errorf("ls:\n%s", ls)
	}
}
