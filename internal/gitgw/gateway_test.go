package gitgw_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/testutil"
)

const (
	forgeName = "forge.test"
	token     = "ghp_test_5f0c2a9d71e84b36"
)

const testProfile = `git:
  repos:
    - repo: forge.test/acme/*
      read: allow
      push: allow
      refs:
        - ref: refs/heads/main
          push: deny
        - ref: refs/heads/feature/**
          force_push: allow
          delete: allow
        - ref: refs/tags/release-*
          push: deny
    - repo: forge.test/acme/secret
      read: deny
credentials:
  - name: forge
    from: forge-token
    forge: forge.test
`

// harness is a real forge (git http-backend behind HTTPS and basic auth),
// the gateway in front of it on its own TLS listener, and a host git
// client that reaches the gateway as https://forge.test:PORT and holds no
// token.
type harness struct {
	t      *testing.T
	forge  *testutil.GitForge
	origin string // the forge's work tree of acme/app (pushes from the "maintainer")
	url    string // https://forge.test:PORT
	args   []string
	caFile string
	client *http.Client // reaches the gateway as https://forge.test:PORT
	recs   testutil.Records
}

func newHarness(t *testing.T) *harness { return newHarnessWith(t, testProfile) }

func newHarnessWith(t *testing.T, profile string) *harness {
	t.Helper()
	h := &harness{t: t}
	h.forge = testutil.NewGitForge(t, forgeName, token)
	h.origin = h.forge.NewRepo(t, "acme/app.git", 3)
	h.forge.NewRepo(t, "acme/secret.git", 1)
	up := h.forge.ServeLoopback(t)

	prof, err := policy.Parse("test.yaml", []byte(profile), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw := gitgw.New(gitgw.Config{
		Secret:  testutil.Secret("forge-token", []byte(token+"\n")),
		Log:     h.recs.Log,
		Mirrors: &gitgw.Mirrors{Dir: t.TempDir()},
	}, prof)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(h.forge.CA)
	rt := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", up.Addr().String())
		},
		TLSClientConfig: &tls.Config{ServerName: forgeName, RootCAs: roots},
		TLSNextProto:    map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	t.Cleanup(rt.CloseIdleConnections)
	_, frontCA, frontCert := testutil.TestCert(t, forgeName)
	front := httptest.NewUnstartedServer(gw.Handler(forgeName, &url.URL{Scheme: "https", Host: forgeName}, rt))
	front.TLS = &tls.Config{Certificates: []tls.Certificate{frontCert}}
	front.StartTLS()
	t.Cleanup(front.Close)
	_, port, _ := net.SplitHostPort(front.Listener.Addr().String())
	h.url = "https://" + forgeName + ":" + port
	h.client = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", front.Listener.Addr().String())
		},
		TLSClientConfig: &tls.Config{RootCAs: front.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs},
	}}
	h.args = []string{"-c", "http.curloptResolve=" + forgeName + ":" + port + ":127.0.0.1"}
	h.caFile = frontCA
	return h
}

// git runs the client's git; it returns the combined output and whether
// it succeeded.
func (h *harness) git(dir string, args ...string) (string, bool) {
	h.t.Helper()
	cmd := testutil.GitCmd(dir, append(append([]string{}, h.args...), args...)...)
	cmd.Env = append(cmd.Env, "GIT_SSL_CAINFO="+h.caFile)
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

func (h *harness) mustGit(dir string, args ...string) string {
	h.t.Helper()
	out, ok := h.git(dir, args...)
	if !ok {
		h.t.Fatalf("git %s:\n%s", strings.Join(args, " "), out)
	}
	return out
}

func (h *harness) clone(args ...string) string {
	h.t.Helper()
	dir := filepath.Join(h.t.TempDir(), "app")
	h.mustGit("", append([]string{"clone", "--quiet", h.url + "/acme/app"}, append(args, dir)...)...)
	return dir
}

func (h *harness) upstreamRef(ref string) string {
	out, err := testutil.GitCmd(filepath.Join(h.forge.Root, "acme/app.git"), "rev-parse", "--verify", "-q", ref).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func (h *harness) records(kind string) []map[string]any { return h.recs.Kind(kind) }

func (h *harness) logText() string { return h.recs.JSON() }

func commit(h *harness, dir, file, msg string) {
	os.WriteFile(filepath.Join(dir, file), []byte(msg+"\n"), 0o644)
	h.mustGit(dir, "add", file)
	h.mustGit(dir, "commit", "--quiet", "-m", msg)
}

func TestCloneFetch(t *testing.T) {
	h := newHarness(t)
	for _, proto := range []string{"0", "1", "2"} {
		dir := h.clone("-c", "protocol.version="+proto)
		if got := testutil.Git(t, dir, "rev-parse", "HEAD"); got != h.upstreamRef("main") {
			t.Fatalf("v%s clone: HEAD %s, upstream main %s", proto, got, h.upstreamRef("main"))
		}
	}
	// Fetch after the forge moved on.
	dir := h.clone()
	commit(h, h.origin, "later.txt", "later")
	testutil.Git(t, h.origin, "push", "--quiet", filepath.Join(h.forge.Root, "acme/app.git"), "main")
	h.mustGit(dir, "fetch", "--quiet", "origin")
	if got := testutil.Git(t, dir, "rev-parse", "origin/main"); got != h.upstreamRef("main") {
		t.Fatalf("fetch: origin/main %s, upstream %s", got, h.upstreamRef("main"))
	}
	// Shallow.
	sh := h.clone("--depth", "1")
	if n := testutil.Git(t, sh, "rev-list", "--count", "HEAD"); n != "1" {
		t.Fatalf("shallow clone has %s commits", n)
	}
	h.mustGit(sh, "fetch", "--quiet", "--deepen", "1")
	if n := testutil.Git(t, sh, "rev-list", "--count", "HEAD"); n != "2" {
		t.Fatalf("deepened clone has %s commits", n)
	}

	// The forge saw the token on every request; the client never had it.
	for _, r := range h.forge.Requests() {
		if !strings.HasSuffix(r, "auth=yes") {
			t.Errorf("forge request without the token: %s", r)
		}
	}
	fetches := h.records("git.fetch")
	if len(fetches) < 5 {
		t.Fatalf("git.fetch records: %d\n%s", len(fetches), h.logText())
	}
	f := fetches[0]
	if f["repo"] != "forge.test/acme/app" || f["op"] != "clone" || f["credential"] != "forge" || f["secret"] != "forge-token" ||
		!strings.Contains(fmt.Sprint(f["rule"]), "git.repos[0]") || f["bytes"].(int64) <= 0 {
		t.Fatalf("clone record: %v", f)
	}
	if strings.Contains(h.logText(), token) {
		t.Fatal("the token is in the log")
	}
}

func TestDeniedRepo(t *testing.T) {
	h := newHarness(t)
	want := "remote error: smx: reading forge.test/acme/secret denied by rule git.repos[1] repo forge.test/acme/secret (profile test, test.yaml:14:7)"
	// Every spelling of the same repository meets the same rule.
	for _, path := range []string{
		"/acme/secret", "/acme/secret.git", "/ACME/Secret.GIT", "/acme/secret/", "/acme/secret.git/",
		"//acme//secret", "/acme/./secret", "/acme/x/../secret", "/acme/x/%2e%2e/secret", "/acme/%73ecret",
		"/acme/%2E/secret", "/Acme/x/%2E%2e/SECRET.git",
	} {
		for _, u := range []string{h.url + path, strings.Replace(h.url, "https://", "https://someone@", 1) + path} {
			out, ok := h.git("", "clone", "--quiet", u, filepath.Join(t.TempDir(), "x"))
			if ok || !strings.Contains(out, want) {
				t.Errorf("clone %s: ok=%v\n%s\nwant %q", u, ok, out, want)
			}
		}
	}
	// An encoded slash or a double encoding is refused, not guessed at.
	for _, path := range []string{"/acme%2fsecret", "/acme/%252e%252e/secret"} {
		out, ok := h.git("", "clone", "--quiet", h.url+path, filepath.Join(t.TempDir(), "x"))
		if ok || !strings.Contains(out, "remote error: smx: refused:") {
			t.Errorf("clone %s: ok=%v\n%s", path, ok, out)
		}
	}
	for _, r := range h.forge.Requests() {
		if strings.Contains(strings.ToLower(r), "secret") {
			t.Errorf("a refused request reached the forge: %s", r)
		}
	}
	ref := h.records("git.refused")
	if len(ref) == 0 || ref[0]["repo"] != "forge.test/acme/secret" || !strings.Contains(fmt.Sprint(ref[0]["rule"]), "test.yaml:14:7 git.repos[1]") {
		t.Fatalf("git.refused records: %v", ref)
	}
}

func TestPushRules(t *testing.T) {
	h := newHarness(t)
	dir := h.clone()
	mainBefore := h.upstreamRef("main")

	// A new branch goes through.
	h.mustGit(dir, "checkout", "--quiet", "-b", "agent/fix-123")
	commit(h, dir, "fix.txt", "fix")
	h.mustGit(dir, "push", "--quiet", "origin", "agent/fix-123")
	if h.upstreamRef("agent/fix-123") != testutil.Git(t, dir, "rev-parse", "HEAD") {
		t.Fatal("agent/fix-123 did not reach the forge")
	}

	// main is protected: the agent reads why.
	out, ok := h.git(dir, "push", "origin", "agent/fix-123:main")
	wantMain := "! [remote rejected] agent/fix-123 -> main (smx: push to refs/heads/main denied by rule git.repos[0].refs[0] repo forge.test/acme/* ref refs/heads/main (profile test, test.yaml:7:11))"
	if ok || !strings.Contains(out, wantMain) {
		t.Fatalf("push to main: ok=%v\n%s\nwant %q", ok, out, wantMain)
	}
	if h.upstreamRef("main") != mainBefore {
		t.Fatal("main moved")
	}

	// Mixed: the allowed ref goes through, the protected one does not.
	commit(h, dir, "fix2.txt", "fix2")
	out, ok = h.git(dir, "push", "origin", "agent/fix-123", "HEAD:main")
	if ok || !strings.Contains(out, "agent/fix-123 -> agent/fix-123") || !strings.Contains(out, "[remote rejected] HEAD -> main (smx: push to refs/heads/main") {
		t.Fatalf("mixed push: ok=%v\n%s", ok, out)
	}
	if h.upstreamRef("agent/fix-123") != testutil.Git(t, dir, "rev-parse", "HEAD") || h.upstreamRef("main") != mainBefore {
		t.Fatal("mixed push: wrong refs upstream")
	}

	// Atomic: nothing goes through.
	commit(h, dir, "fix3.txt", "fix3")
	before := h.upstreamRef("agent/fix-123")
	out, ok = h.git(dir, "push", "--atomic", "origin", "agent/fix-123", "HEAD:main")
	if ok || !strings.Contains(out, "smx: atomic push refused because refs/heads/main was refused") {
		t.Fatalf("atomic push: ok=%v\n%s", ok, out)
	}
	if h.upstreamRef("agent/fix-123") != before {
		t.Fatal("atomic push: agent/fix-123 moved")
	}

	// HEAD: and short names are completed by the client into full names,
	// which are what is decided (refs/heads/main above).

	// Deletes need a delete rule.
	out, ok = h.git(dir, "push", "origin", ":agent/fix-123")
	if ok || !strings.Contains(out, "smx: delete of refs/heads/agent/fix-123 denied") || h.upstreamRef("agent/fix-123") == "" {
		t.Fatalf("delete without a rule: ok=%v\n%s", ok, out)
	}
	h.mustGit(dir, "push", "--quiet", "origin", "HEAD:refs/heads/feature/x")
	h.mustGit(dir, "push", "--quiet", "origin", ":feature/x")
	if h.upstreamRef("feature/x") != "" {
		t.Fatal("feature/x was not deleted")
	}

	// A tag named like the protected branch is a tag: its own rules.
	h.mustGit(dir, "push", "--quiet", "origin", "HEAD:refs/tags/main")
	if h.upstreamRef("refs/tags/main") == "" || h.upstreamRef("refs/heads/main") != mainBefore {
		t.Fatal("tag main: wrong refs upstream")
	}
	h.mustGit(dir, "tag", "v1")
	h.mustGit(dir, "push", "--quiet", "origin", "v1")
	h.mustGit(dir, "tag", "release-1")
	out, ok = h.git(dir, "push", "origin", "release-1")
	if ok || !strings.Contains(out, "smx: push to refs/tags/release-1 denied by rule git.repos[0].refs[2]") {
		t.Fatalf("release tag: ok=%v\n%s", ok, out)
	}
	// Moving an existing tag needs force_push, even with --force.
	commit(h, dir, "fix4.txt", "fix4")
	h.mustGit(dir, "tag", "-f", "v1")
	out, ok = h.git(dir, "push", "--force", "origin", "v1")
	if ok || !strings.Contains(out, "smx: moving existing tag refs/tags/v1 denied") {
		t.Fatalf("moving a tag: ok=%v\n%s", ok, out)
	}

	push := h.records("git.push")
	if len(push) == 0 {
		t.Fatal("no git.push records")
	}
	if strings.Contains(h.logText(), token) {
		t.Fatal("the token is in the log")
	}
}

func TestForcePush(t *testing.T) {
	h := newHarness(t)
	dir := h.clone()
	h.mustGit(dir, "checkout", "--quiet", "-b", "agent/work")
	commit(h, dir, "a.txt", "a")
	commit(h, dir, "b.txt", "b")
	h.mustGit(dir, "push", "--quiet", "origin", "agent/work")
	old := h.upstreamRef("agent/work")

	// A fast-forward is decided on the forge's history and goes through.
	commit(h, dir, "c.txt", "c")
	h.mustGit(dir, "push", "--quiet", "origin", "agent/work")
	ff := h.upstreamRef("agent/work")
	if ff == old {
		t.Fatal("fast-forward did not go through")
	}

	// A rewrite is refused, whatever the client says.
	h.mustGit(dir, "reset", "--quiet", "--hard", "HEAD~2")
	commit(h, dir, "d.txt", "d")
	out, ok := h.git(dir, "push", "--force", "origin", "agent/work")
	if ok || !strings.Contains(out, "[remote rejected] agent/work -> agent/work (smx: force push (not a fast-forward of "+ff[:12]+") to refs/heads/agent/work denied:") {
		t.Fatalf("force push: ok=%v\n%s", ok, out)
	}
	// A commit with the old tree but not its history is not a
	// fast-forward either.
	tree := testutil.Git(t, dir, "rev-parse", ff+"^{tree}")
	orphan := testutil.Git(t, dir, "commit-tree", tree, "-m", "same tree, no history")
	out, ok = h.git(dir, "push", "--force", "origin", orphan+":refs/heads/agent/work")
	if ok || !strings.Contains(out, "smx: force push (not a fast-forward") {
		t.Fatalf("orphan with the old tree: ok=%v\n%s", ok, out)
	}
	if h.upstreamRef("agent/work") != ff {
		t.Fatal("agent/work moved")
	}
	// force_push: allow lets it through.
	h.mustGit(dir, "push", "--quiet", "origin", ff+":refs/heads/feature/y")
	h.mustGit(dir, "push", "--quiet", "--force", "origin", orphan+":refs/heads/feature/y")
	if h.upstreamRef("feature/y") != orphan {
		t.Fatal("allowed force push did not go through")
	}
	var checked bool
	for _, p := range h.records("git.push") {
		for _, r := range p["refs"].([]map[string]any) {
			if r["fast_forward_checked"] == true && r["result"] == "refused" && r["old"] == ff {
				checked = true
			}
		}
	}
	if !checked {
		t.Fatalf("no refused, fast-forward-checked ref in the log:\n%s", h.logText())
	}
}

// The forge's API on the same name: the credential goes only with the
// requests its matchers allow; without matchers, never outside Git.
func TestForgeAPI(t *testing.T) {
	for _, tc := range []struct {
		name, matchers string
		want           map[string]string
	}{
		{"no matchers", "", map[string]string{"GET /api/repos/acme/app/pulls": "auth=no"}},
		{"matchers", "    methods: [GET]\n    paths: [/api/repos/acme/*/pulls]\n", map[string]string{
			"GET /api/repos/acme/app/pulls":               "auth=yes",
			"POST /api/repos/acme/app/pulls":              "auth=no",
			"GET /api/user":                               "auth=no",
			"GET /api/repos/acme/x/../../other/y/pulls":   "auth=no",
			"GET /api/repos/acme/x/%2e%2e/pulls":          "auth=no",
			"GET /api/repos/acme/app/pulls/../../../user": "auth=no",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWith(t, testProfile+tc.matchers)
			for req, want := range tc.want {
				method, path, _ := strings.Cut(req, " ")
				r, _ := http.NewRequest(method, h.url+path, nil)
				r.URL.RawPath = path
				resp, err := h.client.Do(r)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.TrimSpace(string(b)) != want {
					t.Errorf("%s: forge saw %q, want %s", req, b, want)
				}
			}
			uses := h.records("cred.use")
			if tc.matchers != "" && (len(uses) != 1 || uses[0]["path"] != "/api/repos/acme/app/pulls" || uses[0]["credential"] != "forge") {
				t.Errorf("cred.use records: %v", uses)
			}
			if tc.matchers == "" && len(uses) != 0 {
				t.Errorf("cred.use records: %v", uses)
			}
		})
	}
}

// rawPush sends a hand-made receive-pack request (commands, then the pack
// of revs) and returns the response body.
func (h *harness) rawPush(dir string, cmds []string, revs string) string {
	h.t.Helper()
	var body []byte
	for i, c := range cmds {
		if i == 0 {
			c += "\x00report-status"
		}
		body = gitgw.AppendPkt(body, []byte(c+"\n"))
	}
	body = append(body, gitgw.Flush...)
	if revs != "" {
		cmd := testutil.GitCmd(dir, "pack-objects", "--stdout", "--revs", "--thin", "-q")
		cmd.Stdin = strings.NewReader(revs)
		pack, err := cmd.Output()
		if err != nil {
			h.t.Fatal(err)
		}
		body = append(body, pack...)
	}
	req, _ := http.NewRequest("POST", h.url+"/acme/app.git/git-receive-pack", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/x-git-receive-pack-request")
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// Requests no git client sends: ref names that would match another rule
// if they were not decided in full, and a client lying about the old value
// to pass the fast-forward check.
func TestPushTricks(t *testing.T) {
	h := newHarness(t)
	dir := h.clone()
	main := h.upstreamRef("main")
	h.mustGit(dir, "checkout", "--quiet", "-b", "agent/x")
	commit(h, dir, "a.txt", "a")
	h.mustGit(dir, "push", "--quiet", "origin", "agent/x")
	a := h.upstreamRef("agent/x")
	h.mustGit(dir, "checkout", "--quiet", "-b", "side", main)
	commit(h, dir, "c.txt", "c")
	c := testutil.Git(t, dir, "rev-parse", "HEAD")
	zero := strings.Repeat("0", 40)

	out := h.rawPush(dir, []string{
		zero + " " + c + " refs/heads/feature/../main",
		zero + " " + c + " HEAD",
		zero + " " + c + " main",
		zero + " " + c + " refs/tags/../heads/main",
		main + " " + c + " refs/heads/feature/./../main",
	}, c+"\n^"+main+"\n")
	for _, ref := range []string{"refs/heads/feature/../main", "HEAD", "main", "refs/tags/../heads/main", "refs/heads/feature/./../main"} {
		if !strings.Contains(out, "ng "+ref+" smx: ") || !strings.Contains(out, "builtin: malformed request") {
			t.Errorf("%s was not refused:\n%s", ref, out)
		}
	}
	if h.upstreamRef("main") != main {
		t.Fatal("main moved")
	}
	malformed := 0
	for _, r := range h.records("git.refused") {
		if r["rule"] == "builtin: malformed request" && r["op"] == "push" {
			malformed++
		}
	}
	if malformed != 5 {
		t.Errorf("%d malformed-ref refusals logged, want 5:\n%s", malformed, h.logText())
	}

	// The client claims agent/x is at main (an ancestor of c) while the
	// forge has it at a: the gateway's check passes on the claim, and the
	// forge, which compares the claim with the ref, refuses the update.
	out = h.rawPush(dir, []string{main + " " + c + " refs/heads/agent/x"}, c+"\n^"+main+"\n")
	if strings.Contains(out, "ok refs/heads/agent/x") || !strings.Contains(out, "ng refs/heads/agent/x") || strings.Contains(out, "ng refs/heads/agent/x smx:") {
		t.Fatalf("stale old id was accepted:\n%s", out)
	}
	if h.upstreamRef("agent/x") != a {
		t.Fatal("agent/x moved")
	}
	// The true old id: c does not descend from a, so it is a force push.
	out = h.rawPush(dir, []string{a + " " + c + " refs/heads/agent/x"}, c+"\n^"+main+"\n")
	if !strings.Contains(out, "ng refs/heads/agent/x smx: force push (not a fast-forward") {
		t.Fatalf("non-fast-forward with the true old id:\n%s", out)
	}
	// A push that is not a push request at all.
	for _, body := range []string{"garbage", "0000", "0032" + strings.Repeat("x", 46)} {
		req, _ := http.NewRequest("POST", h.url+"/acme/app.git/git-receive-pack", strings.NewReader(body))
		resp, err := h.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(b), "ERR smx: refused:") {
			t.Errorf("body %q: %q", body, b)
		}
	}
}

// A pack larger than git's post buffer arrives chunked; the gateway
// spools it and forwards it with a length (the forge's CGI refuses chunked
// bodies, as some servers do).
func TestLargePush(t *testing.T) {
	h := newHarness(t)
	dir := h.clone()
	h.mustGit(dir, "checkout", "--quiet", "-b", "agent/big")
	blob := make([]byte, 3<<20)
	rand.Read(blob)
	os.WriteFile(filepath.Join(dir, "big.bin"), blob, 0o644)
	h.mustGit(dir, "add", "big.bin")
	h.mustGit(dir, "commit", "--quiet", "-m", "big")
	h.mustGit(dir, "push", "--quiet", "origin", "agent/big")
	if h.upstreamRef("agent/big") != testutil.Git(t, dir, "rev-parse", "HEAD") {
		t.Fatal("agent/big did not reach the forge")
	}
	p := h.records("git.push")
	if len(p) != 1 || p[0]["pack_bytes"].(int64) < 3<<20 {
		t.Fatalf("git.push: %v", p)
	}
}

// rawRequest sends method path (as written, not cleaned or re-encoded)
// to the gateway with the forge's token in the guest's own hands.
func (h *harness) rawRequest(method, path string, body string) (int, string) {
	h.t.Helper()
	u, _ := url.Parse(h.url)
	r, err := http.NewRequest(method, h.url, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	r.URL = &url.URL{Scheme: "https", Host: u.Host, Opaque: "//" + u.Host + path}
	r.SetBasicAuth("x-access-token", token)
	resp, err := h.client.Do(r)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestDumbHTTP asks for a repository's files the way dumb HTTP does, with
// the guest's own credential: under a read-denied repository every path
// and spelling is refused with the rule that denies it, under a readable
// one dumb HTTP is refused all the same, and each refusal is a record.
func TestDumbHTTP(t *testing.T) {
	h := newHarness(t)
	var packs []string
	for _, repo := range []string{"acme/secret.git", "acme/app.git"} {
		bare := filepath.Join(h.forge.Root, repo)
		testutil.Git(t, bare, "repack", "-a", "-d", "-q")
		testutil.Git(t, bare, "update-server-info")
		m, _ := filepath.Glob(filepath.Join(bare, "objects", "pack", "pack-*.pack"))
		if len(m) != 1 {
			t.Fatalf("%s: packs %v", repo, m)
		}
		packs = append(packs, filepath.Base(m[0]))
	}
	head := testutil.Git(t, filepath.Join(h.forge.Root, "acme/secret.git"), "rev-parse", "main")
	files := func(pack string) []string {
		return []string{"HEAD", "config", "description", "packed-refs", "refs/heads/main", "info/refs", "objects/info/packs",
			"objects/pack/" + pack, "objects/pack/" + strings.TrimSuffix(pack, ".pack") + ".idx", "objects/" + head[:2] + "/" + head[2:],
			"info/lfs/objects/batch", "objects/info/alternates", "info/packs", "OBJECTS/PACK/" + pack}
	}
	secretBy := regexpRule("test.yaml:14:7 git.repos[1]")
	n := 0
	for _, spelling := range []string{"/acme/secret.git/", "/acme/secret/", "/ACME/Secret.GIT/", "//acme//secret.git//", "/acme/x/%2e%2e/secret.git/",
		"/acme/%73ecret/", "/acme/%2573ecret.git/", "/acme/x/..%2Fsecret/", "/acme/./secret.git/./"} {
		for _, f := range files(packs[0]) {
			for _, method := range []string{"GET", "HEAD", "POST"} {
				if method == "POST" && !strings.Contains(f, "lfs") {
					continue
				}
				status, body := h.rawRequest(method, spelling+f, "")
				n++
				if status != http.StatusForbidden || method == "GET" && !strings.Contains(body, "smx: ") {
					t.Errorf("%s %s%s: %d %q", method, spelling, f, status, truncate(body, 200))
				}
			}
		}
	}
	for _, f := range files(packs[1]) {
		status, body := h.rawRequest("GET", "/acme/app.git/"+f, "")
		if strings.Contains(f, "lfs") {
			continue // LFS of a readable repository goes on to the forge
		}
		n++
		if status != http.StatusForbidden || !strings.Contains(body, "dumb HTTP is not served") {
			t.Errorf("GET /acme/app.git/%s: %d %q", f, status, truncate(body, 200))
		}
	}
	for _, r := range h.forge.Requests() {
		low := strings.ToLower(r)
		if strings.Contains(low, "secret") || strings.Contains(low, "/objects/") && !strings.Contains(low, "/lfs/") || strings.HasSuffix(strings.Fields(low)[1], "/head") {
			t.Errorf("the forge served %s", r)
		}
	}
	refused := h.records("git.refused")
	denied, dumb := 0, 0
	for _, r := range refused {
		switch {
		case r["repo"] == "forge.test/acme/secret" && secretBy(r["rule"]):
			denied++
		case r["repo"] == "forge.test/acme/app" && r["rule"] == gitgw.RuleDumbHTTP:
			dumb++
		}
	}
	if denied+dumb != n || dumb == 0 || denied == 0 {
		t.Errorf("%d requests, %d records for the secret, %d for dumb HTTP:\n%s", n, denied, dumb, h.logText())
	}
	// The forge's own pages and API under a readable repository go on,
	// also those that end like a Git file.
	for _, p := range []string{"/acme/app/pulls", "/acme/app/blob/main/config", "/acme/app/archive/refs/tags/v1.tar.gz", "/acme/app/commit/HEAD"} {
		if status, _ := h.rawRequest("GET", p, ""); status == http.StatusForbidden {
			t.Errorf("GET %s: %d", p, status)
		}
	}
	if status, _ := h.rawRequest("GET", "/api/repos/acme/secret/pulls", ""); status != http.StatusOK {
		t.Errorf("GET /api/repos/acme/secret/pulls: %d", status)
	}
}

func regexpRule(sub string) func(any) bool {
	return func(v any) bool { return strings.Contains(fmt.Sprint(v), sub) }
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// TestPushOptions pushes with push options: one the profile names goes
// through and is recorded; one it does not name refuses the whole push,
// so a profile that allows only some branches cannot open a merge request
// into main.
func TestPushOptions(t *testing.T) {
	h := newHarnessWith(t, strings.Replace(testProfile, "    - repo: forge.test/acme/secret\n", "      push_options: [ci.skip]\n    - repo: forge.test/acme/secret\n", 1))
	testutil.Git(t, filepath.Join(h.forge.Root, "acme/app.git"), "config", "receive.advertisePushOptions", "true")
	dir := h.clone()
	commit(h, dir, "opt.txt", "opt")
	h.mustGit(dir, "push", "--quiet", "-o", "ci.skip", "origin", "HEAD:refs/heads/agent/opt1")
	if h.upstreamRef("agent/opt1") == "" {
		t.Fatal("agent/opt1 did not reach the forge")
	}
	for _, c := range []struct {
		opts []string
		name string // the option refused
	}{
		{[]string{"merge_request.create", "merge_request.target=main"}, "merge_request.create"},
		{[]string{"ci.skip", "ci.variable=DEPLOY=1"}, "ci.variable"},
		{[]string{"ci.skip=x", "CI.SKIP"}, "CI.SKIP"},
	} {
		opts, name := c.opts, c.name
		args := []string{"push"}
		for _, o := range opts {
			args = append(args, "-o", o)
		}
		out, ok := h.git(dir, append(args, "origin", "HEAD:refs/heads/agent/opt2")...)
		want := "[remote rejected] HEAD -> agent/opt2 (smx: push option \"" + name + "\" denied:"
		if ok || !strings.Contains(out, want) {
			t.Errorf("push -o %v: ok=%v\n%s\nwant %q", opts, ok, out, want)
		}
		if h.upstreamRef("agent/opt2") != "" {
			t.Fatalf("push -o %v reached the forge", opts)
		}
	}
	var okRec, refusedRec bool
	for _, r := range h.records("git.push") {
		switch fmt.Sprint(r["push_options"]) {
		case "[ci.skip]":
			okRec = true
		case "[merge_request.create merge_request.target=main]":
			refusedRec = r["rule"] == "default deny"
		}
	}
	ref := h.records("git.refused")
	if !okRec || !refusedRec || len(ref) != 3 || ref[0]["access"] != "push-option" || fmt.Sprint(ref[0]["push_options"]) != "[merge_request.create merge_request.target=main]" {
		t.Fatalf("records:\n%s", h.logText())
	}
}
