package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestWorktreeAgents: five sandboxes on one host repository, in parallel, each made
// with `agent create --worktree aN` and so on its own worktree and branch
// agent/aN. In the guest each commits in /work (the commit lands in the
// host repository through the shared .git), pushes its own branch through
// the Git gateway (it moves on the forge), and is refused on another
// agent's branch and on main, which the profile alone would allow (the
// refusal names the worktree rule and is in the log). In the shared .git
// the guest cannot rewrite the gitfile, the config, a commondir, main or
// another agent's branch. `agent ls` shows the branches; `agent rm`
// removes a clean worktree, keeps a dirty one (saying where it is), and
// keeps one with --keep-worktree; the others go with the test's cleanup.
func TestWorktreeAgents(t *testing.T) {
	testutil.RequireQEMU(t)
	testutil.RequireGit(t)
	h := testutil.NewNetHost(t)
	const token = "ghp_vmtest_wt_77c1d0e5a2"
	v, forge, image := newForgeVM(t, h, h.PublicIPs[0].String(), token, "")
	forge.NewRepo(t, "acme/app.git", 2)
	bare := filepath.Join(forge.Root, "acme/app.git")
	mainHead := testutil.Git(t, bare, "rev-parse", "refs/heads/main")
	// The profile alone allows pushing any branch, main included: the
	// refusals below come from the worktree narrowing.
	profile := filepath.Join(t.TempDir(), "wt.yaml")
	os.WriteFile(profile, []byte(`network:
  mode: default-deny
  allow:
    - domain: forge.test
      ports: [8443]
files:
  rules:
    - path: /**
      access: rw
git:
  repos:
    - repo: forge.test/acme/*
      read: allow
      push: allow
credentials:
  - name: forge
    from: forge-token
    forge: forge.test
`), 0o644)
	hosts := testutil.HostsFile(t, map[string]string{"forge.test": h.PublicIPs[0].String()})

	repo := filepath.Join(t.TempDir(), "app")
	testutil.Git(t, "", "clone", "--quiet", bare, repo)
	testutil.Git(t, repo, "remote", "set-url", "origin", "https://forge.test:8443/acme/app")
	gitDir := filepath.Join(repo, ".git")
	wtDir := t.TempDir() // a3's worktree goes here (--worktree-dir)

	names := []string{"a1", "a2", "a3", "a4", "a5"}
	for _, n := range names {
		args := []string{"agent", "create", n, "--image", image, "--memory", "384M", "--profile", profile, "--worktree", n}
		if n == "a3" {
			args = append(args, "--worktree-dir", wtDir)
		}
		c := v.cmd(args...)
		c.Dir = repo
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("create %s: %v\n%s", n, err, out)
		}
		t.Cleanup(func() { v.smx("agent", "rm", "-f", n) })
	}
	var wg sync.WaitGroup
	errs := make([]error, len(names))
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := v.cmd("agent", "start", n)
			start.Env = append(start.Env, "SMX_HOSTS_FILE="+hosts, "SMX_EXTRA_CA_FILE="+forge.CAFile)
			if out, err := start.CombinedOutput(); err != nil {
				errs[i] = fmt.Errorf("start %s: %v\n%s", n, err, out)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	outs := make([]string, len(names))
	for i, n := range names {
		other := names[(i+1)%len(names)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			script := `export HOME=/root; cd /work
git config --global user.name agent; git config --global user.email agent@example.test
echo BRANCH=$(git rev-parse --abbrev-ref HEAD)
echo ` + n + ` > ` + n + `.txt && git add ` + n + `.txt && git commit -qm "work of ` + n + `" && echo COMMIT-OK
git push -q origin agent/` + n + ` && echo PUSH-OK
git push -f origin HEAD:refs/heads/agent/` + other + ` 2>&1; echo PUSH-OTHER-RC=$?
git push origin HEAD:main 2>&1; echo PUSH-MAIN-RC=$?
GD=` + gitDir + `
(echo gitdir: /tmp/evil > /work/.git) 2>&1 && echo GITFILE-WROTE || echo GITFILE-REFUSED
(echo '[core]' >> $GD/config) 2>&1 && echo CONFIG-WROTE || echo CONFIG-REFUSED
(echo /tmp/evil > $GD/worktrees/` + n + `/commondir) 2>&1 && echo COMMONDIR-WROTE || echo COMMONDIR-REFUSED
git update-ref refs/heads/main HEAD 2>&1 && echo MAIN-REF-WROTE || echo MAIN-REF-REFUSED
git update-ref refs/heads/agent/` + other + ` HEAD 2>&1 && echo OTHER-REF-WROTE || echo OTHER-REF-REFUSED
(echo x > $GD/HEAD) 2>&1 && echo GD-HEAD-WROTE || echo GD-HEAD-REFUSED
git status --porcelain; echo STATUS-RC=$?
`
			out, err := v.smx("agent", "exec", n, "--", "sh", "-c", script)
			if err != nil {
				out += "\nexec: " + err.Error()
			}
			outs[i] = out
		}()
	}
	wg.Wait()
	for i, n := range names {
		out, other := outs[i], names[(i+1)%len(names)]
		// Both refusals name the worktree rule (the profile allows both).
		if c := strings.Count(out, "(worktree agent/"+n+": pushes only refs/heads/agent/"+n+", profile wt)"); c != 2 {
			t.Errorf("%s: %d refusals name the worktree rule, want 2", n, c)
		}
		if strings.Contains(out, "cannot lock ref") && strings.Contains(out, "PUSH-OK") && strings.Index(out, "cannot lock ref") < strings.Index(out, "PUSH-OK") {
			t.Errorf("%s: its own push could not update the remote-tracking ref", n)
		}
		if strings.Contains(out, "-WROTE") {
			t.Errorf("%s: the guest wrote through the shared .git:\n%s", n, out)
		}
		for _, want := range []string{
			"BRANCH=agent/" + n, "COMMIT-OK", "PUSH-OK", "PUSH-OTHER-RC=1", "PUSH-MAIN-RC=1",
			"smx: push to refs/heads/main denied: ", "HEAD -> agent/" + other + " (smx: ",
			"GITFILE-REFUSED", "CONFIG-REFUSED", "COMMONDIR-REFUSED", "MAIN-REF-REFUSED", "OTHER-REF-REFUSED", "GD-HEAD-REFUSED", "STATUS-RC=0",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: guest output lacks %q", n, want)
			}
		}
		if t.Failed() {
			t.Fatalf("%s guest output:\n%s", n, out)
		}
		// Its branch moved on the forge and in the host repository, to
		// its own commit.
		if msg := testutil.Git(t, bare, "log", "-1", "--format=%s", "refs/heads/agent/"+n); msg != "work of "+n {
			t.Errorf("forge agent/%s is at %q", n, msg)
		}
		if msg := testutil.Git(t, repo, "log", "-1", "--format=%s", "refs/heads/agent/"+n); msg != "work of "+n {
			t.Errorf("host agent/%s is at %q", n, msg)
		}
		logs, _ := v.smx("agent", "logs", n, "--refusals")
		if !strings.Contains(logs, "git.refused") || !strings.Contains(logs, "refs/heads/main") {
			t.Errorf("%s --refusals:\n%s", n, logs)
		}
	}
	if got := testutil.Git(t, bare, "rev-parse", "refs/heads/main"); got != mainHead {
		t.Errorf("main moved on the forge: %s", got)
	}
	if got := testutil.Git(t, repo, "rev-parse", "refs/heads/main"); got != mainHead {
		t.Errorf("main moved in the host repository: %s", got)
	}
	if b, _ := os.ReadFile(filepath.Join(gitDir, "config")); strings.Contains(string(b), "evil") || strings.HasSuffix(string(b), "[core]\n") {
		t.Errorf("the guest wrote the repository's config:\n%s", b)
	}

	out, err := v.smx("agent", "ls")
	if err != nil {
		t.Fatalf("ls: %v\n%s", err, out)
	}
	for _, n := range names {
		if !strings.Contains(out, "(agent/"+n+")") {
			t.Errorf("ls lacks agent/%s:\n%s", n, out)
		}
	}
	js, err := v.smx("agent", "ls", "--json")
	if err != nil {
		t.Fatalf("ls --json: %v\n%s", err, js)
	}
	var list []struct {
		Name     string `json:"name"`
		Worktree struct {
			Branch string `json:"branch"`
			Path   string `json:"path"`
		} `json:"worktree"`
	}
	if err := json.Unmarshal([]byte(js), &list); err != nil {
		t.Fatalf("ls --json: %v\n%s", err, js)
	}
	paths := map[string]string{}
	for _, e := range list {
		if e.Worktree.Branch != "agent/"+e.Name {
			t.Errorf("ls --json: %s on branch %q", e.Name, e.Worktree.Branch)
		}
		paths[e.Name] = e.Worktree.Path
	}
	if paths["a3"] != filepath.Join(wtDir, "a3") {
		t.Errorf("a3's worktree at %q, want in --worktree-dir", paths["a3"])
	}

	// a1 is clean: removed. a2 is dirty: kept, said with its path. a3:
	// kept by --keep-worktree.
	os.WriteFile(filepath.Join(paths["a2"], "wip.txt"), []byte("wip"), 0o644)
	out, err = v.smx("agent", "rm", "-f", "a1", "a2")
	if err != nil {
		t.Fatalf("rm: %v\n%s", err, out)
	}
	if !strings.Contains(out, "worktree "+paths["a1"]+" removed") || !strings.Contains(out, "worktree "+paths["a2"]+" (branch agent/a2) kept: it has 1 uncommitted change") {
		t.Errorf("rm said:\n%s", out)
	}
	if _, err := os.Stat(paths["a1"]); !os.IsNotExist(err) {
		t.Errorf("a1's clean worktree is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(paths["a2"], "wip.txt")); err != nil {
		t.Errorf("a2's dirty worktree is gone: %v", err)
	}
	out, err = v.smx("agent", "rm", "-f", "--keep-worktree", "a3")
	if err != nil || !strings.Contains(out, "kept") {
		t.Fatalf("rm --keep-worktree: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(paths["a3"], "a3.txt")); err != nil {
		t.Errorf("a3's worktree is gone: %v", err)
	}
	if got := testutil.Git(t, repo, "log", "-1", "--format=%s", "refs/heads/agent/a1"); got != "work of a1" {
		t.Errorf("agent/a1 after rm: %q", got)
	}
}
