package policy

import (
	"net/netip"
	"strings"
	"testing"
)

const askProfile = `network:
  mode: ask
  allow:
    - domain: allowed.example.test
  deny:
    - domain: "*.bad.example.test"
  ask:
    - cidr: 10.9.0.0/16
      ports: [5432]
files:
  rules:
    - path: /work/**
      access: rw
    - path: /work/secrets/**
      access: ask
    - path: /work/docs/**
      access: ask-write
git:
  repos:
    - repo: example.test/acme/app
      read: allow
      push: allow
      refs:
        - ref: refs/heads/main
          push: ask
          force_push: ask
ssh:
  allow:
    - host: build1.example.test
      user: deploy
      ask: true
credentials:
  - name: model
    from: model-key
    domain: api.example.test
    header: x-api-key
    ask: true
ask:
  timeout: 30s
  max: 4
`

func TestAskDecisions(t *testing.T) {
	p, err := Parse("ask.yaml", []byte(askProfile), nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.AskTimeout().String() != "30s" || p.AskMax() != 4 {
		t.Fatalf("ask settings: %v %d", p.AskTimeout(), p.AskMax())
	}
	for _, tc := range []struct {
		req        Request
		allow, ask bool
		rule       string
	}{
		{Request{Kind: KindNet, Host: "allowed.example.test", Port: 443}, true, false, "network.allow[0]"},
		{Request{Kind: KindNet, Host: "other.example.test", Port: 443}, false, true, "ask.yaml:2:9 network.mode ask"},
		{Request{Kind: KindNet, Host: "x.bad.example.test", Port: 443}, false, false, "network.deny[0]"},
		// Private addresses stay closed under mode ask; an ask cidr inside
		// the private range opens them to a question.
		{Request{Kind: KindNet, IP: netip.MustParseAddr("192.168.1.1"), Port: 80}, false, false, "private"},
		{Request{Kind: KindNet, IP: netip.MustParseAddr("10.9.1.1"), Port: 5432}, false, true, "network.ask[0]"},
		{Request{Kind: KindNet, IP: netip.MustParseAddr("169.254.169.254"), Port: 80}, false, false, "builtin"},
		{Request{Kind: KindFile, Path: "/work/a.go", Access: "rw"}, true, false, "files.rules[0]"},
		{Request{Kind: KindFile, Path: "/work/secrets/k", Access: "ro"}, false, true, "files.rules[1]"},
		{Request{Kind: KindFile, Path: "/work/docs/r.md", Access: "ro"}, true, false, "files.rules[2]"},
		{Request{Kind: KindFile, Path: "/work/docs/r.md", Access: "rw"}, false, true, "files.rules[2]"},
		{Request{Kind: KindGit, Repo: "example.test/acme/app", Access: "push", Ref: "refs/heads/dev"}, true, false, "git.repos[0] "},
		{Request{Kind: KindGit, Repo: "example.test/acme/app", Access: "push", Ref: "refs/heads/main"}, false, true, "git.repos[0].refs[0]"},
		// A spelling that differs only in case is asked too, not allowed by the repo rule.
		{Request{Kind: KindGit, Repo: "example.test/acme/app", Access: "push", Ref: "refs/heads/MAIN"}, false, true, "git.repos[0].refs[0]"},
		{Request{Kind: KindGit, Repo: "example.test/acme/app", Access: "force-push", Ref: "refs/heads/main"}, false, true, "git.repos[0].refs[0]"},
		{Request{Kind: KindGit, Repo: "example.test/acme/app", Access: "delete", Ref: "refs/heads/main"}, false, false, "default deny"},
		{Request{Kind: KindSSH, Host: "build1.example.test", User: "deploy"}, false, true, "ssh.allow[0]"},
		{Request{Kind: KindSSH, Host: "build1.example.test", User: "root"}, false, false, "default deny"},
	} {
		d := p.Decide(tc.req)
		if d.Allow != tc.allow || d.Ask != tc.ask || !strings.Contains(d.Rule, tc.rule) {
			t.Errorf("%s: got allow=%v ask=%v %q (%s); want allow=%v ask=%v rule ~ %q", tc.req, d.Allow, d.Ask, d.Rule, d.Reason, tc.allow, tc.ask, tc.rule)
		}
	}
	if d := p.DecideName("other.example.test"); !d.Ask {
		t.Errorf("DecideName under mode ask: %+v", d)
	}
	if c, ok := p.CredentialFor(Request{Kind: KindNet, Host: "api.example.test", Port: 443}); !ok || !c.Ask {
		t.Errorf("credential ask: %+v %v", c, ok)
	}
	// The frozen copy the supervisor loads keeps every ask.
	y, err := p.FrozenYAML()
	if err != nil {
		t.Fatal(err)
	}
	q, err := Parse("frozen.yaml", y, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, y)
	}
	if q.Hash != p.Hash {
		t.Errorf("frozen copy hash %s != %s\n%s", q.Hash, p.Hash, y)
	}
	for _, r := range []Request{{Kind: KindNet, Host: "other.example.test", Port: 443}, {Kind: KindSSH, Host: "build1.example.test", User: "deploy"},
		{Kind: KindFile, Path: "/work/docs/r.md", Access: "rw"}, {Kind: KindGit, Repo: "example.test/acme/app", Access: "push", Ref: "refs/heads/main"}} {
		if !q.Decide(r).Ask {
			t.Errorf("frozen copy lost the ask for %s", r)
		}
	}
}

func TestAskInvalid(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"git:\n  repos:\n    - repo: a.test/b/c\n      read: ask\n", "ask applies to push"},
		{"network:\n  mode: deny-all\n  ask:\n    - domain: a.test\n", "can never apply"},
		{"network:\n  ask:\n    - cidr: 169.254.0.0/16\n", "always closed"},
		{"network:\n  ask:\n    - domain: metadata.google.internal\n", "always closed"},
		{"ssh:\n  deny:\n    - host: a.test\n      ask: true\n", "allow rules only"},
		{"ask:\n  timeout: 2h\n", "outside 1s..1h"},
		{"credentials:\n  - name: f\n    from: t\n    forge: forge.test\n    ask: true\n", "ask applies to domain bindings"},
		{"files:\n  rules:\n    - path: /w\n      access: maybe\n", "not rw, ro or deny (or ask, ask-write"},
	} {
		_, err := Parse("bad.yaml", []byte(tc.yaml), nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// A files rule that says ask never puts a change of a file the host runs
// to the host user (it stays read-only, as under an rw rule), nor a change
// on a read-only mount; a deny the case-folded name meets beats an ask.
func TestAskFilesLimits(t *testing.T) {
	p, err := Parse("ask.yaml", []byte(`files:
  rules:
    - path: /work/**
      access: ask-write
    - path: /data/**
      access: ask
    - path: /work/hooks-too/.git/hooks/**
      access: ask-write
    - path: /work/Secret
      access: deny
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	work := FileMount{Guest: "/work", Rule: "-v /src:/work"}
	roMount := FileMount{Guest: "/data", ReadOnly: true, Rule: "-v /d:/data:ro"}
	fold := FileMount{Guest: "/work", Rule: "-v /src:/work", FoldCase: true}
	for _, c := range []struct {
		m            FileMount
		path, access string
		allow, ask   bool
		rule         string
	}{
		{work, "/work/src/app.go", "rw", false, true, "files.rules[0]"},
		{work, "/work/src/app.go", "ro", true, false, "files.rules[0]"},
		{work, "/work/.git/config", "rw", false, false, ruleProtected},
		{work, "/work/.git/hooks/pre-commit", "rw", false, false, ruleProtected},
		{work, "/work/.envrc", "rw", false, false, ruleProtected},
		{work, "/work/.git/config", "ro", true, false, "files.rules[0]"},
		{work, "/work/.git/objects/ab/cd", "rw", false, true, "files.rules[0]"},
		// A rule that spells the protected elements out still asks.
		{work, "/work/hooks-too/.git/hooks/pre-commit", "rw", false, true, "files.rules[2]"},
		{roMount, "/data/x", "rw", false, false, "-v /d:/data:ro"},
		{roMount, "/data/x", "ro", false, true, "files.rules[1]"},
		{fold, "/work/secret", "rw", false, false, "files.rules[3]"},
		{fold, "/work/secret", "ro", false, false, "files.rules[3]"},
		{fold, "/work/other", "rw", false, true, "files.rules[0]"},
	} {
		d := p.DecideMounted(c.m, c.path, c.access)
		if d.Allow != c.allow || d.Ask != c.ask || !strings.Contains(d.Rule, c.rule) {
			t.Errorf("%s %s (fold %v): got allow=%v ask=%v %q (%s); want allow=%v ask=%v rule ~ %q",
				c.path, c.access, c.m.FoldCase, d.Allow, d.Ask, d.Rule, d.Reason, c.allow, c.ask, c.rule)
		}
	}
}

// A name an ask rule names only on some ports resolves (Ask), as under
// mode ask: the question is put on the flow. A deny on every port, or
// an always-closed name, stays a refusal; a name no rule names stays
// unresolved in default-deny.
func TestDecideNameAsk(t *testing.T) {
	p, err := Parse("a.yaml", []byte(`network:
  ask:
    - domain: newhost.example.test
      ports: [80, 443]
    - domain: "*.pkgs.example.test"
      ports: [443]
    - domain: quic.example.test
      proto: udp
      ports: [443]
  deny:
    - domain: gone.pkgs.example.test
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host      string
		ask       bool
		rule, not string
	}{
		{"newhost.example.test", true, "a.yaml:3:7 network.ask[0]", "port"},
		{"a.pkgs.example.test", true, "network.ask[1]", "port"},
		{"quic.example.test", true, "network.ask[2]", "port"},
		{"gone.pkgs.example.test", false, "network.deny[0]", ""},
		{"other.example.test", false, "default deny", ""},
		{"metadata.google.internal", false, "always closed", ""},
	} {
		d := p.DecideName(tc.host)
		if d.Allow || d.Ask != tc.ask || !strings.Contains(d.Rule, tc.rule) || tc.not != "" && strings.Contains(d.Reason, tc.not) {
			t.Errorf("DecideName(%s) = %+v; want ask=%v rule ~ %q", tc.host, d, tc.ask, tc.rule)
		}
	}
}
