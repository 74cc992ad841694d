package cli_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestFilesHostRunsNothing: with the dev profile and a writable workspace
// holding a real repository, root in the guest tries each way to make the
// host's git, direnv or editor run something; then the host runs git in
// the workspace as a shell prompt or an IDE would, and no marker appears.
// Every attempt is a file.refused record, and git in the guest still
// commits, branches and pushes.
func TestFilesHostRunsNothing(t *testing.T) {
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	img := testutil.DebianImage(t, vmHome(t, bin))

	top := t.TempDir()
	marks := t.TempDir() // host paths the planted commands would touch
	repo, forge := filepath.Join(top, "repo"), filepath.Join(top, "forge.git")
	hostHome := t.TempDir()
	git := func(dir string, args ...string) (string, error) {
		c := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=host", "-c", "user.email=host@example.test"}, args...)...)
		c.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME="+hostHome, "GIT_TERMINAL_PROMPT=0")
		out, err := c.CombinedOutput()
		return string(out), err
	}
	must := func(dir string, args ...string) string {
		t.Helper()
		out, err := git(dir, args...)
		if err != nil {
			t.Fatalf("host git %v: %v\n%s", args, err, out)
		}
		return out
	}
	must(top, "init", "-q", "--bare", forge)
	must(top, "init", "-q", "-b", "main", repo)
	os.WriteFile(filepath.Join(repo, "a.txt"), []byte("one\n"), 0o644)
	os.MkdirAll(filepath.Join(repo, ".vscode"), 0o755)
	os.WriteFile(filepath.Join(repo, ".vscode/settings.json"), []byte("{}\n"), 0o644)
	must(repo, "add", "-A")
	must(repo, "commit", "-qm", "first")
	// A relative URL resolves the same on the host and in the guest.
	must(repo, "remote", "add", "origin", "../forge.git")
	must(repo, "push", "-q", "-u", "origin", "main")

	// Control: the same settings written by the host do run on the host,
	// so a missing marker below means the guest could not plant them.
	ctl := filepath.Join(t.TempDir(), "ctl")
	must(top, "init", "-q", ctl)
	must(ctl, "config", "core.fsmonitor", "touch "+filepath.Join(marks, "control"))
	must(ctl, "status")
	if _, err := os.Stat(filepath.Join(marks, "control")); err != nil {
		t.Fatalf("control: host git did not run core.fsmonitor: %v", err)
	}
	os.Remove(filepath.Join(marks, "control"))

	v := startSandbox(t, "protect", "--image", img, "--profile", "dev", "-v", top+":/work", "--memory", "1G")
	m := func(name string) string { return filepath.Join(marks, name) }
	hook := func(name string) string { return "printf '#!/bin/sh\\ntouch " + m(name) + "\\n' > " }
	setup := `cd /work/repo && git config --global --add safe.directory '*' && git config --global user.name guest && git config --global user.email guest@example.test && `
	tricks := [][2]string{
		{"fsmonitor", setup + "git config core.fsmonitor 'touch " + m("fsmonitor") + "'"},
		{"hook", setup + hook("hook") + ".git/hooks/reference-transaction && chmod +x .git/hooks/reference-transaction"},
		{"hookspath", setup + "mkdir -p hk && " + hook("hookspath") + "hk/reference-transaction && chmod +x hk/reference-transaction && git config core.hooksPath hk"},
		{"filter", setup + "git config filter.x.clean 'touch " + m("filter") + "'"},
		{"attributes", setup + "echo '* filter=x diff=x' > .git/info/attributes"},
		{"diffexternal", setup + "git config diff.external 'touch " + m("diffexternal") + "'"},
		{"sshcommand", setup + "git config core.sshCommand 'touch " + m("sshcommand") + "'"},
		{"sed", setup + "sed -i 's/^\\[core\\]/[core]\\n\\tfsmonitor = touch " + strings.ReplaceAll(m("sed"), "/", "\\/") + "/' .git/config"},
		{"swap", setup + "mv .git .git2 && git config -f .git2/config --add core.fsmonitor 'touch " + m("swap") + "' && mv .git2 .git"},
		{"envrc", setup + "echo 'touch " + m("envrc") + "' > .envrc"},
		{"tasks", setup + "echo '{\"tasks\":[]}' > .vscode/tasks.json"},
		{"settings", setup + "echo '{\"terminal.integrated.shell.linux\":\"/tmp/x\"}' > .vscode/settings.json"},
		{"bare", "mkdir -p /work/fake/objects /work/fake/refs && echo 'ref: refs/heads/main' > /work/fake/HEAD"},
	}
	res := v.steps(t, tricks)
	for _, s := range tricks {
		if got := res[s[0]]; got == "ok" || got == "" {
			t.Errorf("guest trick %s: got %q, want a failure", s[0], got)
		} else if !strings.Contains(got, "Read-only file system") {
			t.Logf("guest trick %s failed with %q", s[0], got)
		}
	}

	// The host's git, as a prompt and an IDE run it, and the rest of what
	// would run a planted setting.
	for _, args := range [][]string{{"status"}, {"diff"}, {"log", "-p"}, {"fetch", "origin"}, {"commit", "-q", "--allow-empty", "-m", "host"}, {"checkout", "-q", "-b", "host-branch"}} {
		if out, err := git(repo, args...); err != nil {
			t.Errorf("host git %v: %v\n%s", args, err, out)
		}
	}
	if out, err := git(filepath.Join(top, "fake"), "status"); err == nil {
		t.Errorf("host git status in /work/fake found a repository:\n%s", out)
	}
	ents, _ := os.ReadDir(marks)
	for _, e := range ents {
		t.Errorf("marker %s appeared: the host ran what the guest planted", e.Name())
	}
	for _, p := range []string{"repo/.envrc", "repo/.vscode/tasks.json", "repo/.git/info/attributes", "repo/.git/hooks/reference-transaction", "repo/.git2", "fake/HEAD"} {
		if _, err := os.Lstat(filepath.Join(top, p)); err == nil {
			t.Errorf("%s exists on the host", p)
		}
	}
	if cfg, _ := os.ReadFile(filepath.Join(repo, ".git/config")); strings.Contains(string(cfg), "fsmonitor") || strings.Contains(string(cfg), "hooksPath") {
		t.Errorf("host .git/config changed:\n%s", cfg)
	}

	recs := v.fileRefusals(t)
	const rule = `^builtin: files the host runs are read-only`
	expectRefusal(t, recs, "create", "/work/repo/.git/config.lock", rule)
	expectRefusal(t, recs, "create", "/work/repo/.git/hooks/reference-transaction", rule)
	expectRefusal(t, recs, "create", "/work/repo/.git/info/attributes", rule)
	expectRefusal(t, recs, "rename", "/work/repo/.git", rule)
	expectRefusal(t, recs, "create", "/work/repo/.envrc", rule)
	expectRefusal(t, recs, "create", "/work/repo/.vscode/tasks.json", rule)
	// Truncating an existing file is an open or a setattr, as the guest
	// kernel sends it.
	found := false
	for _, r := range recs {
		found = found || r.f("path") == "/work/repo/.vscode/settings.json" && regexp.MustCompile(rule).MatchString(r.f("rule"))
	}
	if !found {
		t.Errorf("no file.refused record for /work/repo/.vscode/settings.json")
	}
	expectRefusal(t, recs, "create", "/work/fake/HEAD", rule)

	// Git in the guest still works: branch, commit, push without -u (the
	// guest's system config sets push.default=current), a branch from a
	// remote-tracking one, fetch.
	out, err := v.sh(`set -e; cd /work/repo
git config --system --get push.default
git checkout -q -b feature
echo two >> a.txt
git commit -qam "from the guest"
git push -q 2>&1
git checkout -q -b f2 origin/main
git fetch -q origin
git log -1 --format=%s origin/feature
echo done`)
	if err != nil || !strings.HasPrefix(out, "current\n") || !strings.HasSuffix(out, "from the guest\ndone\n") {
		t.Fatalf("git in the guest: %v\n%s", err, out)
	}
	if got := must(forge, "log", "--format=%an %s", "feature"); !strings.HasPrefix(got, "guest from the guest\n") {
		t.Errorf("forge feature = %q", got)
	}
	// What git cannot do without writing .git/config says why.
	out, _ = v.sh(`cd /work/repo && git remote add other ../forge.git 2>&1`)
	if !strings.Contains(out, "Read-only file system") {
		t.Errorf("git remote add in the guest: %q, want Read-only file system", out)
	}
}
