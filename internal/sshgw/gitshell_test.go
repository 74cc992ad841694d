package sshgw

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/testutil"
)

// gitShellProfile opens a whole plain git-shell host and closes one
// repository to reading and another's main to pushes: deny must beat the
// broad allow whatever path names them. {ROOT} is the git user's home.
const gitShellProfile = `ssh:
  allow:
    - host: shell.test
      user: git
      git_root: {ROOT}
git:
  repos:
    - repo: shell.test/**
      read: allow
      push: allow
    - repo: shell.test/acme/secret
      read: deny
    - repo: shell.test/acme/app
      refs:
        - ref: refs/heads/main
          push: deny
`

type gitShell struct {
	*gitSSH
	home string
}

// newGitShell is a plain sshd + git-shell server: user git (its shell
// git-shell, its home the repositories' root, as /etc/passwd says in
// sshd's mount namespace) behind a gateway whose ssh rule says so with
// git_root.
func newGitShell(t *testing.T) *gitShell {
	e := newGWEnv(t)
	h := testutil.NewNetHost(t)
	home := t.TempDir()
	for _, name := range []string{"app", "secret"} {
		testutil.BareRepo(t, filepath.Join(home, "acme", name+".git"), name, map[string]string{"README": name + "\n"})
	}
	caPub := filepath.Join(e.dir, "trusted_ca.pub")
	sshd := testutil.StartSSHD(t, h, testutil.SSHDConfig{Addr: netip.AddrPortFrom(h.PublicIPs[0], 22), TrustedUserCAKeys: caPub,
		Passwd: []string{"git:x:0:0:git:" + home + ":/usr/bin/git-shell"}})
	kh := filepath.Join(e.dir, "shell_known_hosts")
	os.WriteFile(kh, []byte(sshd.KnownHostsLine("shell.test")+"\n"), 0o644)

	prof, err := policy.Parse("test.yaml", []byte(strings.ReplaceAll(gitShellProfile, "{ROOT}", home)), nil)
	if err != nil {
		t.Fatal(err)
	}
	g := &gitSSH{e: e, root: home, bare: filepath.Join(home, "acme", "app.git")}
	g.mirrors = &gitgw.Mirrors{Dir: filepath.Join(e.dir, "git-mirrors")}
	g.gw = e.gitGateway(prof, kh, g.mirrors)
	g.port = e.serve(g.gw, "shell.test", sshd.Addr)
	g.sshCmd = "ssh " + strings.Join(fixP(e.sshArgs("shell.test", g.port)), " ")
	return &gitShell{gitSSH: g, home: home}
}

// spellings are the ways a client can name the repository acme/NAME on
// the git-shell host: git-shell resolves each to HOME/acme/NAME.git.
func (g *gitShell) spellings(name string) []string {
	var out []string
	for _, p := range []string{
		"acme/" + name + ".git", "acme/" + name, "acme/" + name + ".git/", "ACME/" + strings.ToUpper(name) + ".git",
		g.home + "/acme/" + name + ".git", g.home + "/acme/" + name, g.home + "/acme/" + name + "/",
		"~/acme/" + name + ".git", "~git/acme/" + name + ".git", "~/acme/" + name,
	} {
		out = append(out, "git@shell.test:"+p)
	}
	return append(out,
		"ssh://git@shell.test/~/acme/"+name+".git", "ssh://git@shell.test/~git/acme/"+name+".git",
		"ssh://git@shell.test"+g.home+"/acme/"+name+".git")
}

// unclean are spellings the gateway cannot map to one repository with
// certainty; it refuses them whatever the rules say.
func (g *gitShell) unclean(name string) []string {
	var out []string
	for _, p := range []string{
		"./acme/" + name + ".git", "acme//" + name + ".git", "acme/x/../" + name + ".git", "acme/./" + name + ".git",
		g.home + "/../" + filepath.Base(g.home) + "/acme/" + name + ".git", g.home + "//acme/" + name + ".git",
		"acme/" + name + "/.git", "acme/" + name + "%2egit", "~root/acme/" + name + ".git", "/tmp/elsewhere/acme/" + name + ".git",
		"~/../" + filepath.Base(g.home) + "/acme/" + name + ".git", "~git//acme/" + name + ".git",
	} {
		out = append(out, "git@shell.test:"+p)
	}
	// An ssh:// URL's path is absolute: /acme/NAME.git is not under the home.
	return append(out, "ssh://git@shell.test/acme/"+name+".git", "ssh://git@shell.test/~/acme/x/../"+name+".git")
}

// TestGitShellSpellings clones and pushes through every spelling of a
// protected repository on a plain sshd + git-shell server: a read-denied
// one is never read, a protected main never moves, whatever the path.
func TestGitShellSpellings(t *testing.T) {
	g := newGitShell(t)
	e := g.e
	for _, u := range append(g.spellings("secret"), g.unclean("secret")...) {
		dir := filepath.Join(t.TempDir(), "x")
		out, ok := g.git("", "clone", "--quiet", u, dir)
		if ok || !(strings.Contains(out, "reading shell.test/acme/secret is denied") || strings.Contains(out, "repository path")) {
			t.Errorf("clone %s: ok=%v\n%s", u, ok, out)
		}
		if _, err := os.Stat(filepath.Join(dir, "README")); err == nil {
			t.Errorf("clone %s: the secret's files reached the client", u)
		}
	}
	e.expect(t, audit.KindSSHRefused, map[string]string{"request": "exec git-upload-pack", "repo": "shell.test/acme/secret", "rule": "git.repos[1]"})
	// Commands typed by hand: git's other spelling, no quotes, quotes git-shell does not take.
	for _, cmd := range []string{
		"git upload-pack '~/acme/secret.git'", "git-upload-pack " + g.home + "/acme/secret.git", "git-upload-pack '~git/acme/secret'",
		`git-upload-pack "acme/secret.git"`, `git-upload-pack 'acme/'\''secret.git'`, "git-upload-archive '" + g.home + "/acme/secret.git'",
	} {
		out, errs, code := e.ssh("shell.test", g.port, "", "git@shell.test", cmd)
		if code == 0 || strings.Contains(out, "refs/heads/main") {
			t.Errorf("%s: code %d\n%s\n%s", cmd, code, out, errs)
		}
	}
	e.mu.Lock()
	for _, r := range e.recs {
		if r.kind == audit.KindGitFetch && strings.Contains(r.f("repo"), "secret") {
			t.Errorf("a fetch of the secret was served: %v", r.fields)
		}
	}
	e.mu.Unlock()

	// The app is readable under every spelling, and its main is protected
	// under every spelling.
	mainBefore := g.ref("refs/heads/main")
	work := filepath.Join(t.TempDir(), "app")
	g.mustGit(t, "", "clone", "--quiet", "git@shell.test:~/acme/app.git", work)
	sshCommit(t, work, "change.txt")
	for _, u := range g.spellings("app") {
		if strings.Contains(u, "ACME") {
			continue // the server's paths are case-sensitive: no such repository to push to
		}
		out, ok := g.git(work, "push", u, "HEAD:refs/heads/main")
		if ok || !strings.Contains(out, "push to refs/heads/main denied by rule git.repos[2].refs[0]") {
			t.Errorf("push %s to main: ok=%v\n%s", u, ok, out)
		}
		if g.ref("refs/heads/main") != mainBefore {
			t.Fatalf("push %s moved main", u)
		}
	}
	for _, u := range g.unclean("app") {
		out, ok := g.git(work, "push", u, "HEAD:refs/heads/main")
		if ok || !strings.Contains(out, "repository path") {
			t.Errorf("push %s to main: ok=%v\n%s", u, ok, out)
		}
	}
	if g.ref("refs/heads/main") != mainBefore {
		t.Fatal("main moved")
	}
	r := e.expect(t, audit.KindGitRefused, map[string]string{"ref": "refs/heads/main", "repo": "shell.test/acme/app", "transport": "ssh"})
	if !strings.Contains(r.f("rule"), "git.repos[2].refs[0]") {
		t.Fatalf("refused record: %v", r.fields)
	}
	// An allowed branch goes through whichever spelling, recorded as the one repository.
	g.mustGit(t, work, "push", "--quiet", "ssh://git@shell.test"+g.home+"/acme/app.git", "HEAD:refs/heads/agent/x")
	if g.ref("refs/heads/agent/x") == "" {
		t.Fatal("agent/x did not reach the server")
	}
	e.expect(t, audit.KindGitPush, map[string]string{"repo": "shell.test/acme/app", "refs": "refs/heads/agent/x"})
}
