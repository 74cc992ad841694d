package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNormalizeRepo(t *testing.T) {
	const want = "github.com/acme/app"
	for _, s := range []string{
		"github.com/acme/app", "github.com/acme/app.git", "GitHub.com/ACME/App.GIT", "github.com/acme/app/",
		"github.com/acme/app.git/", "github.com//acme//app", "github.com/acme/./app", "github.com/acme/x/../app",
		"github.com/acme/x/%2e%2e/app", "github.com/acme/%61pp", "github.com/%2E/acme/app", "user@github.com/acme/app",
		"https://github.com/acme/app", "https://user:pw@GITHUB.COM:443/acme/app.git/", "ssh://git@github.com/acme/app.git",
		"git@github.com:acme/app.git", "github.com.:acme/app", "https://github.com/acme/x/%2E%2e/app",
	} {
		got, err := NormalizeRepo(s)
		if err != nil || got != want {
			t.Errorf("NormalizeRepo(%q) = %q, %v; want %q", s, got, err, want)
		}
	}
	for _, s := range []string{
		"github.com/acme%2fapp", "github.com/acme/%252e%252e/app", "github.com/../acme/app", "github.com/acme/app/../../..",
		"github.com/acme/a%00pp", "github.com/", "github.com", "file:///etc/passwd", "github.com/acme/a*", "github.com/acme/%zz",
		"github.com/acme/a%5capp", "localhost/acme/app/%",
	} {
		if got, err := NormalizeRepo(s); err == nil {
			t.Errorf("NormalizeRepo(%q) = %q, want an error", s, got)
		}
	}
}

func TestIsForge(t *testing.T) {
	p, err := Parse("f.yaml", []byte(`git:
  repos:
    - repo: github.com/acme/*
      read: allow
    - repo: "*.corp.example/**"
      read: allow
credentials:
  - name: gl
    from: gl-token
    forge: gitlab.com
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{"github.com": true, "GitHub.com.": true, "gitlab.com": true, "git.corp.example": true,
		"api.github.com": false, "evilgithub.com": false, "": false, "corp.example": false} {
		if got := p.IsForge(host); got != want {
			t.Errorf("IsForge(%q) = %v, want %v", host, got, want)
		}
	}
	if !p.HasForges() {
		t.Error("HasForges false")
	}
	for name, want := range map[string]bool{"locked": false, "open": false, "dev": true} {
		b, _ := Builtin(name)
		if b.HasForges() != want {
			t.Errorf("%s: HasForges %v", name, !want)
		}
	}
	if open, _ := Builtin("open"); open.IsForge("github.com") {
		t.Error(`open's "**" names github.com as a forge`)
	}
}

// FuzzNormalizeRepo: whatever the spelling, the identity is stable (a
// second pass changes nothing) and has no dot segments or empty elements.
func FuzzNormalizeRepo(f *testing.F) {
	for _, s := range []string{"github.com/acme/app", "https://u@github.com/a/./b/../c.git/", "git@h:a/%2e%2e/b", "h/a//b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := NormalizeRepo(s)
		if err != nil {
			return
		}
		for _, el := range strings.Split(r, "/") {
			if el == "" || el == "." || el == ".." {
				t.Fatalf("%q -> %q has a bad element", s, r)
			}
		}
		if r != strings.ToLower(r) {
			t.Fatalf("%q -> %q is not lower case", s, r)
		}
		// Only a doubled suffix (name.git.git) keeps one ".git".
		if r2, err := NormalizeRepo(r); err != nil || r2 != r && r2 != strings.TrimSuffix(r, ".git") {
			t.Fatalf("%q -> %q -> %q, %v", s, r, r2, err)
		}
	})
}

// deny_paths refuses a domain binding's endpoints outright, every
// spelling of them, and wins over paths; it keeps through the canonical
// form and goes only with domain bindings.
func TestCredentialDenyPaths(t *testing.T) {
	p, err := Parse("d.yaml", []byte(`credentials:
  - name: anthropic
    from: claude
    domain: api.anthropic.com
    header: Authorization
    paths: [/v1/messages, /api/oauth/**]
    deny_paths: [/api/oauth/claude_cli/**, /v1/oauth/**]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := p.Credentials[0]
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"/api/oauth/claude_cli/create_api_key", true},
		{"/api/oauth/claude_cli/create_api_key/", true},
		{"/API/OAUTH/claude_cli/create_api_key", true},
		{"/api/oauth/claude_cli%2Fcreate_api_key", true},
		{"/api/oauth/%63laude_cli/create_api_key", true},
		{"/api/oauth/profile/../claude_cli/roles", true},
		{"/api//oauth/./claude_cli/create_api_key", true},
		{"/api/oauth\\claude_cli\\create_api_key", true},
		{"/v1/oauth/token", true},
		{"/api/oauth/%zz", true}, // does not decode
		{"/api/oauth/profile", false},
		{"/v1/messages", false},
		{"/api/oauth/claude_cli_other", false},
	} {
		if got := c.Denies(tc.path); got != tc.want {
			t.Errorf("Denies(%s) = %v, want %v", tc.path, got, tc.want)
		}
	}
	if !c.MatchRequest("POST", "/api/oauth/claude_cli/create_api_key", nil) {
		t.Error("paths should match the denied endpoint: deny_paths must win on its own")
	}
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse("d.yaml", y, nil)
	if err != nil || q.Hash != p.Hash || len(q.Credentials[0].DenyPaths) != 2 {
		t.Fatalf("round trip: %v\n%s", err, y)
	}
	// The sandbox's frozen copy, which its supervisor enforces, keeps them.
	fy, err := p.FrozenYAML()
	if err != nil {
		t.Fatal(err)
	}
	frozen := filepath.Join(t.TempDir(), "sandboxes", "s", "profile.yaml")
	os.MkdirAll(filepath.Dir(frozen), 0o755)
	os.WriteFile(frozen, fy, 0o600)
	if fz, err := LoadFrozen(frozen); err != nil || !fz.Credentials[0].Denies("/v1/oauth/token") {
		t.Fatalf("frozen: %v\n%s", err, fy)
	}
	for _, bad := range []string{
		"credentials:\n  - name: x\n    from: s\n    forge: github.com\n    deny_paths: [/a]\n",
		"credentials:\n  - name: x\n    from: s\n    domain: a.example\n    header: X\n    deny_paths: [a/b]\n",
		"credentials:\n  - name: x\n    from: s\n    domain: a.example\n    header: X\n    deny_paths: [\"/a/../b\"]\n",
	} {
		if _, err := Parse("bad.yaml", []byte(bad), nil); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
}

func TestCredentialMatchers(t *testing.T) {
	p, err := Parse("c.yaml", []byte(`credentials:
  - name: gh-api
    from: gh-token
    domain: api.github.com
    header: Authorization
    format: "Bearer {}"
    methods: [GET, head]
    paths:
      - /repos/acme/*/pulls
      - /repos/acme/*/issues/**
  - name: forge
    from: gh-token
    forge: github.com
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	c := p.Credentials[0]
	if !c.HasMatchers() || p.Credentials[1].HasMatchers() {
		t.Fatal("HasMatchers")
	}
	for _, tc := range []struct {
		method, path string
		want         bool
	}{
		{"GET", "/repos/acme/app/pulls", true},
		{"HEAD", "/repos/acme/app/pulls", true},
		{"GET", "/repos/acme/app/issues", true},
		{"GET", "/repos/acme/app/issues/3/comments", true},
		{"GET", "/repos/acme/%61pp/pulls", true},
		{"POST", "/repos/acme/app/pulls", false},
		{"get", "/repos/acme/app/pulls", false},
		{"GET", "/repos/acme/app/pulls/1", false},
		{"GET", "/repos/other/app/pulls", false},
		{"GET", "/repos/acme/app/../../other/x/pulls", false},
		{"GET", "/repos/acme/x/%2e%2e/pulls", false},
		{"GET", "/repos/acme%2fapp/pulls", false},
		{"GET", "/repos//acme/app/pulls", false},
		{"GET", "/repos/acme/app/pulls/", false},
		{"GET", "/repos/acme/%2561pp/pulls", false},
		{"GET", "repos/acme/app/pulls", false},
	} {
		if got := c.MatchRequest(tc.method, tc.path, nil); got != tc.want {
			t.Errorf("%s %s: %v, want %v", tc.method, tc.path, got, tc.want)
		}
	}
	// Header conditions: every one must match a value of its header.
	h, err := Parse("h.yaml", []byte(`credentials:
  - name: gh-api
    from: gh-token
    domain: api.github.com
    header: Authorization
    headers:
      accept: "application/vnd.github*"
      X-GitHub-Api-Version: "2022-11-28"
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := h.Credentials[0]
	for _, tc := range []struct {
		hdr  map[string][]string
		want bool
	}{
		{map[string][]string{"Accept": {"application/vnd.github+json"}, "X-Github-Api-Version": {"2022-11-28"}}, true},
		{map[string][]string{"Accept": {"text/html", "application/vnd.github.raw"}, "X-Github-Api-Version": {"2022-11-28"}}, true},
		{map[string][]string{"Accept": {"application/vnd.github+json"}}, false},
		{map[string][]string{"Accept": {"text/html"}, "X-Github-Api-Version": {"2022-11-28"}}, false},
		{nil, false},
	} {
		if got := hc.MatchRequest("GET", "/x", tc.hdr); got != tc.want {
			t.Errorf("headers %v: %v, want %v", tc.hdr, got, tc.want)
		}
	}
	if yh, _ := h.YAML(); !strings.Contains(string(yh), "Accept: application/vnd.github*") {
		t.Errorf("canonical form:\n%s", yh)
	}
	// The canonical form keeps the matchers (same hash when read back).
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse("c.yaml", y, nil)
	if err != nil || q.Hash != p.Hash || len(q.Credentials[0].Paths) != 2 || len(q.Credentials[0].Methods) != 2 {
		t.Fatalf("round trip: %v\n%s", err, y)
	}
	for _, bad := range []string{
		"credentials:\n  - name: x\n    from: s\n    ssh_host: build1\n    paths: [/a]\n",
		"credentials:\n  - name: x\n    from: s\n    forge: github.com\n    methods: [\"GET POST\"]\n",
		"credentials:\n  - name: x\n    from: s\n    forge: github.com\n    paths: [repos/a]\n",
		"credentials:\n  - name: x\n    from: s\n    forge: github.com\n    paths: [\"/a/../b\"]\n",
		"credentials:\n  - name: x\n    from: s\n    forge: github.com\n    headers: [Accept]\n",
		"credentials:\n  - name: x\n    from: s\n    forge: github.com\n    headers:\n      \"bad header\": x\n",
		"credentials:\n  - name: x\n    from: s\n    forge: github.com\n    headers:\n      Accept: a\n      accept: b\n",
	} {
		if _, err := Parse("bad.yaml", []byte(bad), nil); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
}

// A push option is allowed only when a rule for the repository names it;
// git_root and push_options survive the frozen profile's round trip.
func TestPushOptionsAndGitRoot(t *testing.T) {
	src := `ssh:
  allow:
    - host: git.corp.example
      user: git
      git_root: /srv/git
git:
  repos:
    - repo: github.com/acme/*
      read: allow
      push: allow
      push_options: [ci.skip, "merge_request.title*"]
    - repo: github.com/acme/app
      push_options: [ci.variable]
`
	p := mustParse(t, "o.yaml", src)
	for _, c := range []struct {
		repo, opt string
		allow     bool
	}{
		{"github.com/acme/app", "ci.skip", true},
		{"github.com/acme/app.git", "ci.variable=FOO=bar", true},
		{"github.com/acme/lib", "ci.variable=FOO=bar", false},
		{"github.com/acme/lib", "merge_request.title=x", true},
		{"github.com/acme/lib", "merge_request.create", false},
		{"github.com/other/x", "ci.skip", false},
		{"github.com/acme/app", "", false},
		{"github.com/acme/app", "=x", false},
		{"github.com/acme/app", "ci skip", false},
		{"github.com/acme/app", "ci.*", false},
	} {
		d := p.DecidePushOption(c.repo, c.opt)
		if d.Allow != c.allow || d.Rule == "" {
			t.Errorf("%s -o %q: %+v, want allow=%v", c.repo, c.opt, d, c.allow)
		}
	}
	if d := p.DecidePushOption("github.com/acme/lib", "merge_request.create"); !d.DefaultDeny() || !strings.Contains(d.Reason, "push_options") {
		t.Errorf("refusal: %+v", d)
	}
	_, r := p.DecideSSH(Request{Kind: KindSSH, Host: "git.corp.example", User: "git"})
	if r.GitRoot != "/srv/git" {
		t.Errorf("git_root: %+v", r)
	}
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	q := mustParse(t, "frozen.yaml", string(y))
	if q.Hash != p.Hash || q.SSH.Allow[0].GitRoot != "/srv/git" || len(q.Git.Repos[0].PushOptions) != 2 {
		t.Fatalf("round trip:\n%s", y)
	}
	if p.Hash == mustParse(t, "o.yaml", strings.Replace(src, "ci.skip, ", "", 1)).Hash {
		t.Error("push_options is not in the hash")
	}
	if _, err := Parse("p.yaml", []byte("git:\n  repos:\n    - repo: a.example/x\n      push_options: [\"ci skip\"]\n"), nil); err == nil ||
		!strings.Contains(err.Error(), `push_options: "ci skip"`) {
		t.Errorf("bad option name: %v", err)
	}
}

// TestUnreachableForges: a forge named only in git (or by a forge
// credential) is not reachable: naming it opens no network path. The
// profile says which forges are named in vain, and the refusal of the
// forge's name says what is missing.
func TestUnreachableForges(t *testing.T) {
	p, err := Parse("f.yaml", []byte(`network:
  mode: default-deny
  allow:
    - domain: gitlab.com
      ports: [443]
  deny:
    - domain: bitbucket.org
git:
  repos:
    - repo: github.com/acme/*
      read: allow
    - repo: github.com/acme/app
      push: allow
    - repo: gitlab.com/acme/app
      read: allow
    - repo: codeberg.org/acme/secret
      read: deny
    - repo: bitbucket.org/acme/app
      read: allow
    - repo: "*.corp.example/**"
      read: allow
credentials:
  - name: gitea
    from: gitea-token
    forge: git.example.org
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]UnreachableForge{}
	for _, u := range p.UnreachableForges() {
		if _, dup := got[u.Forge]; dup {
			t.Errorf("%s listed twice", u.Forge)
		}
		got[u.Forge] = u
	}
	if len(got) != 3 {
		t.Errorf("unreachable forges: %v, want github.com, bitbucket.org, git.example.org", got)
	}
	gh := got["github.com"]
	if gh.Pos.Line != 10 || !strings.Contains(gh.String(), "git.repos[0] repo github.com/acme/* names the forge github.com") ||
		!strings.Contains(gh.String(), "add a network.allow rule `domain: github.com` with `ports: [443]`") || !strings.HasPrefix(gh.String(), "f.yaml:10:") {
		t.Errorf("github.com: %+v\n%s", gh, gh)
	}
	if bb := got["bitbucket.org"]; !strings.Contains(bb.String(), "the rule f.yaml:") || !strings.Contains(bb.String(), "network.deny[0] domain bitbucket.org refuses it") {
		t.Errorf("bitbucket.org: %s", bb)
	}
	if c := got["git.example.org"]; c.Named != "credential gitea" {
		t.Errorf("git.example.org: %+v", c)
	}
	// The name's refusal (what the DNS server records) says what is missing.
	d := p.DecideName("github.com")
	if d.Allow || !strings.Contains(d.Reason, "the git rules name this forge, but they open no network path to it: a network.allow rule for github.com on port 443 does") {
		t.Errorf("DecideName(github.com) = %+v", d)
	}
	if d := p.DecideName("example.net"); strings.Contains(d.Reason, "forge") {
		t.Errorf("DecideName(example.net) speaks of a forge: %+v", d)
	}
	// With the network rule, nothing is missing.
	p2, err := Parse("g.yaml", []byte(`network:
  allow:
    - domain: github.com
      ports: [443]
git:
  repos:
    - repo: github.com/acme/*
      read: allow
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if u := p2.UnreachableForges(); len(u) != 0 {
		t.Errorf("github.com allowed on 443: %v", u)
	}
	for _, name := range []string{"dev", "open", "locked"} {
		b, _ := Builtin(name)
		if u := b.UnreachableForges(); len(u) != 0 {
			t.Errorf("built-in %s: %v", name, u)
		}
	}
}
