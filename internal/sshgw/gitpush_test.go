package sshgw

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/testutil"
)

// gitPushProfile has the same ref rules as the Git gateway's HTTPS tests
// (internal/gitgw), on a forge reached over SSH. {ROOT} is where the
// bare repositories live on the forge.
const gitPushProfile = `ssh:
  allow:
    - host: forge.test
      user: root
git:
  repos:
    - repo: forge.test{ROOT}/acme/*
      read: allow
      push: allow
      refs:
        - ref: refs/heads/main
          push: deny
        - ref: refs/heads/feature/**
          force_push: allow
          delete: allow
      push_options: [ci.skip]
`

type gitSSH struct {
	e       *gwEnv
	root    string // the forge's directory of repositories
	bare    string // acme/app.git on the forge
	url     string
	sshCmd  string
	port    int
	gw      *Gateway
	mirrors *gitgw.Mirrors
}

// newGitSSH puts a Git forge (sshd running git-receive-pack over bare
// repositories) behind a gateway whose profile has ref rules, and seeds
// acme/app with a main branch.
func newGitSSH(t testing.TB) *gitSSH {
	e := newGWEnv(t)
	// Lower case and short: the repository identity is forge.test + path.
	root, err := os.MkdirTemp("", "smxgit")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	g := &gitSSH{e: e, root: root, bare: filepath.Join(root, "acme", "app.git")}
	testutil.BareRepo(t, g.bare, "initial", map[string]string{"README": "app\n"})

	prof, err := policy.Parse("test.yaml", []byte(strings.ReplaceAll(gitPushProfile, "{ROOT}", root)), nil)
	if err != nil {
		t.Fatal(err)
	}
	g.mirrors = &gitgw.Mirrors{Dir: filepath.Join(e.dir, "git-mirrors")}
	g.gw = e.gitGateway(prof, filepath.Join(e.dir, "known_hosts"), g.mirrors)
	g.port = e.serve(g.gw, "forge.test", e.a.Addr)
	g.sshCmd = "ssh " + strings.Join(fixP(e.sshArgs("forge.test", g.port)), " ")
	g.url = "root@forge.test:" + root + "/acme/app.git"
	return g
}

// gitGateway is a gateway for the Git-over-SSH tests, closed when the test
// ends: the env's CAs and records, the known hosts file kh, Git mirrors in
// mirrors, and the profile prof.
func (e *gwEnv) gitGateway(prof *policy.Profile, kh string, mirrors *gitgw.Mirrors) *Gateway {
	gw, err := New(Config{
		Sandbox:    "test",
		HostCA:     e.hostCA,
		UserCAPath: e.userCAPath,
		KnownHosts: []string{kh},
		GitMirrors: mirrors,
		Log:        e.log,
	}, prof)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { gw.Close() })
	return gw
}

func (g *gitSSH) git(dir string, args ...string) (string, bool) {
	cmd := testutil.GitCmd(dir, args...)
	cmd.Env = append(cmd.Env, "GIT_SSH_COMMAND="+g.sshCmd)
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

func (g *gitSSH) mustGit(t testing.TB, dir string, args ...string) {
	t.Helper()
	if out, ok := g.git(dir, args...); !ok {
		t.Fatalf("git %s:\n%s", strings.Join(args, " "), out)
	}
}

func (g *gitSSH) ref(name string) string {
	out, err := testutil.GitCmd(g.bare, "rev-parse", "--verify", "--quiet", name).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func (g *gitSSH) clone(t testing.TB) string {
	dir := filepath.Join(t.TempDir(), "app")
	g.mustGit(t, "", "clone", "--quiet", g.url, dir)
	return dir
}

func sshCommit(t testing.TB, dir, file string) {
	os.WriteFile(filepath.Join(dir, file), []byte(file+"\n"), 0o644)
	testutil.Git(t, dir, "add", file)
	testutil.Git(t, dir, "commit", "--quiet", "-m", file)
}

// TestGitPushOverSSH pushes with the host's git client over SSH through
// the gateway and expects exactly what the same pushes meet over HTTPS
// (internal/gitgw TestPushRules, TestForcePush): per-ref decisions, the
// same "[remote rejected]" lines, atomic pushes, deletes, force pushes
// decided on the forge's history, and git.* records.
func TestGitPushOverSSH(t *testing.T) {
	g := newGitSSH(t)
	e := g.e
	dir := g.clone(t)
	mainBefore := g.ref("refs/heads/main")
	if mainBefore == "" || testutil.Git(t, dir, "rev-parse", "HEAD") != mainBefore {
		t.Fatal("clone over SSH did not get main")
	}
	// A clone is a git.fetch record, as over HTTPS.
	fr := e.expect(t, audit.KindGitFetch, map[string]string{"transport": "ssh", "op": "clone", "repo": "forge.test" + g.root + "/acme/app"})
	if fr.f("wants") == "0" || fr.f("bytes") == "0" || !strings.Contains(fr.f("rule"), "git.repos[0]") {
		t.Fatalf("git.fetch record: %v", fr.fields)
	}

	// A new branch goes through.
	testutil.Git(t, dir, "checkout", "--quiet", "-b", "agent/fix-123")
	sshCommit(t, dir, "fix.txt")
	g.mustGit(t, dir, "push", "--quiet", "origin", "agent/fix-123")
	if g.ref("refs/heads/agent/fix-123") != testutil.Git(t, dir, "rev-parse", "HEAD") {
		t.Fatal("agent/fix-123 did not reach the forge")
	}
	e.expect(t, audit.KindGitPush, map[string]string{"transport": "ssh", "refs": "refs/heads/agent/fix-123", "repo": "forge.test" + g.root + "/acme/app"})

	// main is protected: the client shows the same line as over HTTPS.
	out, ok := g.git(dir, "push", "origin", "agent/fix-123:main")
	wantMain := "! [remote rejected] agent/fix-123 -> main (smx: push to refs/heads/main denied by rule git.repos[0].refs[0] repo forge.test" +
		g.root + "/acme/* ref refs/heads/main (profile test, test.yaml:11:11))"
	if ok || !strings.Contains(out, wantMain) {
		t.Fatalf("push to main: ok=%v\n%s\nwant %q", ok, out, wantMain)
	}
	if g.ref("refs/heads/main") != mainBefore {
		t.Fatal("main moved")
	}
	r := e.expect(t, audit.KindGitRefused, map[string]string{"ref": "refs/heads/main", "transport": "ssh", "rule": "git.repos[0].refs[0]"})
	if r.f("access") != "push" || r.f("host") != "forge.test" {
		t.Fatalf("refused record: %v", r.fields)
	}

	// Mixed: the allowed ref goes through, the protected one does not.
	sshCommit(t, dir, "fix2.txt")
	out, ok = g.git(dir, "push", "origin", "agent/fix-123", "HEAD:main")
	if ok || !strings.Contains(out, "agent/fix-123 -> agent/fix-123") || !strings.Contains(out, "[remote rejected] HEAD -> main (smx: push to refs/heads/main") {
		t.Fatalf("mixed push: ok=%v\n%s", ok, out)
	}
	if g.ref("refs/heads/agent/fix-123") != testutil.Git(t, dir, "rev-parse", "HEAD") || g.ref("refs/heads/main") != mainBefore {
		t.Fatal("mixed push: wrong refs upstream")
	}

	// Atomic: nothing goes through.
	sshCommit(t, dir, "fix3.txt")
	before := g.ref("refs/heads/agent/fix-123")
	out, ok = g.git(dir, "push", "--atomic", "origin", "agent/fix-123", "HEAD:main")
	if ok || !strings.Contains(out, "smx: atomic push refused because refs/heads/main was refused") {
		t.Fatalf("atomic push: ok=%v\n%s", ok, out)
	}
	if g.ref("refs/heads/agent/fix-123") != before {
		t.Fatal("atomic push: agent/fix-123 moved")
	}
	e.expect(t, audit.KindGitPush, map[string]string{"transport": "ssh", "atomic": "true", "refs": "gitgw: atomic push"})

	// Deletes need a delete rule.
	out, ok = g.git(dir, "push", "origin", ":agent/fix-123")
	if ok || !strings.Contains(out, "smx: delete of refs/heads/agent/fix-123 denied") || g.ref("refs/heads/agent/fix-123") == "" {
		t.Fatalf("delete without a rule: ok=%v\n%s", ok, out)
	}
	e.expect(t, audit.KindGitRefused, map[string]string{"ref": "refs/heads/agent/fix-123", "access": "delete", "transport": "ssh"})
	g.mustGit(t, dir, "push", "--quiet", "origin", "HEAD:refs/heads/feature/x")
	g.mustGit(t, dir, "push", "--quiet", "origin", ":feature/x")
	if g.ref("refs/heads/feature/x") != "" {
		t.Fatal("feature/x was not deleted")
	}

	// Force pushes: a fast-forward goes through, decided on the forge's
	// history (the host-side mirror, fetched over the gateway's own SSH
	// connection); a rewrite does not, whatever the client says.
	ff := g.ref("refs/heads/agent/fix-123")
	testutil.Git(t, dir, "reset", "--quiet", "--hard", ff)
	sshCommit(t, dir, "ff.txt")
	g.mustGit(t, dir, "push", "--quiet", "origin", "agent/fix-123")
	ff = g.ref("refs/heads/agent/fix-123")
	if ff != testutil.Git(t, dir, "rev-parse", "HEAD") {
		t.Fatal("fast-forward did not go through")
	}
	testutil.Git(t, dir, "reset", "--quiet", "--hard", "HEAD~2")
	sshCommit(t, dir, "rewrite.txt")
	out, ok = g.git(dir, "push", "--force", "origin", "agent/fix-123")
	if ok || !strings.Contains(out, "[remote rejected] agent/fix-123 -> agent/fix-123 (smx: force push (not a fast-forward of "+ff[:12]+") to refs/heads/agent/fix-123 denied:") {
		t.Fatalf("force push: ok=%v\n%s", ok, out)
	}
	// A commit with the old tree but not its history is not a
	// fast-forward either.
	tree := testutil.Git(t, dir, "rev-parse", ff+"^{tree}")
	orphan := testutil.Git(t, dir, "commit-tree", tree, "-m", "same tree, no history")
	out, ok = g.git(dir, "push", "--force", "origin", orphan+":refs/heads/agent/fix-123")
	if ok || !strings.Contains(out, "smx: force push (not a fast-forward") {
		t.Fatalf("orphan with the old tree: ok=%v\n%s", ok, out)
	}
	if g.ref("refs/heads/agent/fix-123") != ff {
		t.Fatal("agent/fix-123 moved")
	}
	r = e.expect(t, audit.KindGitRefused, map[string]string{"ref": "refs/heads/agent/fix-123", "access": "force-push", "new": orphan})
	if r.f("old") != ff {
		t.Fatalf("force-push record: %v", r.fields)
	}
	checked := false
	e.mu.Lock()
	for _, p := range e.recs {
		if p.kind != audit.KindGitPush {
			continue
		}
		for _, rf := range p.fields["refs"].([]map[string]any) {
			if rf["fast_forward_checked"] == true && rf["result"] == "refused" && rf["old"] == ff {
				checked = true
			}
		}
	}
	e.mu.Unlock()
	if !checked {
		t.Fatal("no refused, fast-forward-checked ref in the git.push records")
	}
	// force_push: allow lets it through.
	g.mustGit(t, dir, "push", "--quiet", "origin", ff+":refs/heads/feature/y")
	g.mustGit(t, dir, "push", "--quiet", "--force", "origin", orphan+":refs/heads/feature/y")
	if g.ref("refs/heads/feature/y") != orphan {
		t.Fatal("allowed force push did not go through")
	}

	// Nothing to push still works, and main never moved.
	out, ok = g.git(dir, "push", "origin", orphan+":refs/heads/feature/y")
	if !ok || !strings.Contains(out, "Everything up-to-date") {
		t.Fatalf("up to date push: ok=%v\n%s", ok, out)
	}
	if g.ref("refs/heads/main") != mainBefore {
		t.Fatal("main moved")
	}
}

// TestGitPushOverSSHRaw talks receive-pack by hand, as a guest that does
// not use git could: the filter decides what it decides for git, and
// what it cannot parse goes nowhere.
func TestGitPushOverSSHRaw(t *testing.T) {
	g := newGitSSH(t)
	e := g.e
	main := g.ref("refs/heads/main")
	dir := g.clone(t)
	g.mustGit(t, dir, "push", "--quiet", "origin", "main:refs/heads/feature/x")
	run := func(stdin string) (string, string) {
		cmd := exec.Command("ssh", append(fixP(e.sshArgs("forge.test", g.port)), "root@forge.test", "git-receive-pack '"+g.root+"/acme/app.git'")...)
		cmd.Stdin = strings.NewReader(stdin)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		cmd.Run()
		return out.String(), errb.String()
	}
	zero := strings.Repeat("0", 40)
	pkt := func(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

	// Without report-status no ref can be refused alone: the delete of
	// feature/x (allowed by its rule) does not ride along with main's.
	out, _ := run(pkt(main+" "+zero+" refs/heads/main\x00agent=raw\n") + pkt(main+" "+zero+" refs/heads/feature/x\n") + "0000")
	if !strings.Contains(out, "ng refs/heads/main smx: delete of refs/heads/main denied") ||
		!strings.Contains(out, "ng refs/heads/feature/x smx: the client asked for no report-status") {
		t.Fatalf("no report-status: %q", out)
	}
	if g.ref("refs/heads/main") != main || g.ref("refs/heads/feature/x") != main {
		t.Fatal("a ref was deleted")
	}
	e.expect(t, audit.KindGitRefused, map[string]string{"ref": "refs/heads/feature/x", "rule": gitgw.RuleNoReport, "transport": "ssh"})

	// A short ref name is refused, never completed.
	out, _ = run(pkt(main+" "+zero+" main\x00report-status\n") + "0000")
	if !strings.Contains(out, "ng main ") || g.ref("refs/heads/main") != main {
		t.Fatalf("short name: %q", out)
	}

	// A stream that is not a push request reaches nothing.
	_, errs := run(pkt(main+" "+zero+" refs/heads/main\n") + "0000")
	if !strings.Contains(errs, "smx: refused:") || g.ref("refs/heads/main") != main {
		t.Fatalf("malformed: %q", errs)
	}
	e.expect(t, audit.KindGitRefused, map[string]string{"rule": gitgw.RuleMalformed, "transport": "ssh"})
}

// TestGitPushOptionsOverSSH: push options are decided as over HTTPS
// (internal/gitgw TestPushOptions), by the same code: one the profile
// names goes through and is recorded, any other refuses the push.
func TestGitPushOptionsOverSSH(t *testing.T) {
	g := newGitSSH(t)
	e := g.e
	testutil.Git(t, g.bare, "config", "receive.advertisePushOptions", "true")
	dir := g.clone(t)
	sshCommit(t, dir, "opt.txt")
	g.mustGit(t, dir, "push", "--quiet", "-o", "ci.skip", "origin", "HEAD:refs/heads/agent/opt1")
	if g.ref("refs/heads/agent/opt1") == "" {
		t.Fatal("agent/opt1 did not reach the forge")
	}
	e.expect(t, audit.KindGitPush, map[string]string{"transport": "ssh", "refs": "refs/heads/agent/opt1", "push_options": "[ci.skip]"})
	out, ok := g.git(dir, "push", "-o", "merge_request.create", "-o", "merge_request.target=main", "origin", "HEAD:refs/heads/agent/opt2")
	want := `[remote rejected] HEAD -> agent/opt2 (smx: push option "merge_request.create" denied:`
	if ok || !strings.Contains(out, want) {
		t.Fatalf("push -o merge_request.create: ok=%v\n%s\nwant %q", ok, out, want)
	}
	if g.ref("refs/heads/agent/opt2") != "" {
		t.Fatal("the push with a refused option reached the forge")
	}
	e.expect(t, audit.KindGitRefused, map[string]string{"transport": "ssh", "access": "push-option", "ref": "refs/heads/agent/opt2",
		"push_options": "merge_request.create merge_request.target=main"})
}

// TestGitPushAfterCommand: a push cannot join a session channel whose
// stream already runs unfiltered (a command started first).
func TestGitPushAfterCommand(t *testing.T) {
	g := newGitSSH(t)
	nc, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", g.port))
	if err != nil {
		t.Fatal(err)
	}
	cc, chans, reqs, err := ssh.NewClientConn(nc, "forge.test:22", &ssh.ClientConfig{User: "root",
		HostKeyCallback: (&ssh.CertChecker{IsHostAuthority: func(k ssh.PublicKey, _ string) bool {
			return string(k.Marshal()) == string(g.e.hostCA.PublicKey().Marshal())
		}}).CheckHostKey})
	if err != nil {
		t.Fatal(err)
	}
	c := ssh.NewClient(cc, chans, reqs)
	defer c.Close()
	ch, creqs, err := c.OpenChannel("session", nil)
	if err != nil {
		t.Fatal(err)
	}
	go ssh.DiscardRequests(creqs)
	start := func(cmd string) { ch.SendRequest("exec", true, ssh.Marshal(struct{ Command string }{cmd})) }
	start("sleep 5")
	start("git-receive-pack '" + g.root + "/acme/app.git'")
	errs, _ := io.ReadAll(ch.Stderr())
	if !strings.Contains(string(errs), "a Git push must be the first command of its SSH session") {
		t.Fatalf("stderr %q", errs)
	}
	g.e.expect(t, audit.KindSSHRefused, map[string]string{"request": "exec git-receive-pack", "reason": "must be the first command"})
}

// BenchmarkGitPushOverSSH compares a push of 10 new commits that
// fast-forward a branch, from the host's git through the gateway (ref
// rules decided, fast-forward checked on the mirror, fetched over the
// gateway's own upstream connection) with the same push by ssh from the
// host straight to the same sshd (the peer). The ratio is logged
// (run with -v).
func BenchmarkGitPushOverSSH(b *testing.B) {
	g := newGitSSH(b)
	e := g.e
	kh := filepath.Join(e.dir, "direct_known_hosts")
	os.WriteFile(kh, []byte(e.b.KnownHostsLine("forge.test")+"\n"), 0o644)
	direct := "ssh -F /dev/null -o HostName=" + e.b.Addr.Addr().String() + " -o HostKeyAlias=forge.test -o UserKnownHostsFile=" + kh +
		" -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes -o BatchMode=yes -o IdentityAgent=none -o IdentitiesOnly=yes -i " + e.legacyKey
	ms := map[string]float64{}
	dirs := map[string]string{} // b.Run runs its function again with a larger b.N
	outer := b
	for _, p := range []struct{ name, sshCmd string }{{"gateway", g.sshCmd}, {"direct", direct}} {
		b.Run(p.name, func(b *testing.B) {
			dir := dirs[p.name]
			if dir == "" {
				dir = g.clone(outer)
				dirs[p.name] = dir
			}
			branch := "bench/" + p.name
			pushEnv := append(testutil.GitCmd("").Env, "GIT_SSH_COMMAND="+p.sshCmd)
			push := func() time.Duration {
				for i := 0; i < 10; i++ {
					sshCommit(b, dir, fmt.Sprintf("%s-%d-%d.txt", p.name, i, time.Now().UnixNano()))
				}
				cmd := exec.Command("git", "push", "--quiet", "origin", "HEAD:refs/heads/"+branch)
				cmd.Dir, cmd.Env = dir, pushEnv
				start := time.Now()
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("push: %v\n%s", err, out)
				}
				return time.Since(start)
			}
			b.StopTimer()
			push() // creates the branch (and, through the gateway, fills the mirror)
			var total time.Duration
			for i := 0; i < b.N; i++ {
				total += push()
			}
			ms[p.name] = float64(total.Milliseconds()) / float64(b.N)
			b.ReportMetric(ms[p.name], "ms/push")
		})
	}
	if ms["direct"] > 0 {
		b.Logf("git push (10 commits, fast-forward): gateway %.0f ms, direct ssh %.0f ms (%.2f×)", ms["gateway"], ms["direct"], ms["gateway"]/ms["direct"])
	}
}
