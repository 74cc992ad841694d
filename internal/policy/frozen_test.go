package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A sandbox's frozen copy cites the user's file and line, not its own.
func TestFrozenCitesTheUsersFile(t *testing.T) {
	dir := t.TempDir()
	user := filepath.Join(dir, "team.yaml")
	src := `name: team
extends: locked
network:
  mode: default-deny
  allow:
    - domain: api.example.com
      ports: [443]
  deny:
    - domain: bad.example.com
files:
  rules:
    - path: /work/**
      access: rw
git:
  repos:
    - repo: github.com/acme/*
      read: allow
      refs:
        - ref: refs/heads/main
          push: deny
`
	if err := os.WriteFile(user, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(user)
	if err != nil {
		t.Fatal(err)
	}
	y, err := p.FrozenYAML()
	if err != nil {
		t.Fatal(err)
	}
	frozen := filepath.Join(dir, "sandboxes", "s", "profile.yaml")
	os.MkdirAll(filepath.Dir(frozen), 0o755)
	if err := os.WriteFile(frozen, y, 0o600); err != nil {
		t.Fatal(err)
	}
	q, err := LoadFrozen(frozen)
	if err != nil {
		t.Fatalf("LoadFrozen: %v\n%s", err, y)
	}
	if q.Hash != p.Hash || q.Name != "team" || q.Source != user {
		t.Errorf("frozen: hash %s (want %s), name %q, source %q", q.Hash, p.Hash, q.Name, q.Source)
	}
	for _, c := range []struct {
		req, rule string
	}{
		{"https://api.example.com/", user + ":6:7 network.allow[0] domain api.example.com ports 443"},
		{"https://bad.example.com/", user + ":9:7 network.deny[0] domain bad.example.com"},
		{"file:rw:/work/x", user + ":12:7 files.rules[0] rw /work/**"},
		{"git:push:github.com/acme/app:refs/heads/main", user + ":19:11 git.repos[0].refs[0]"},
		{"https://other.example.com/", "default deny"},
	} {
		r, err := ParseRequest(c.req)
		if err != nil {
			t.Fatal(err)
		}
		if d := q.Decide(r); !strings.HasPrefix(d.Rule, c.rule) {
			t.Errorf("%s: rule %q, want %q", c.req, d.Rule, c.rule)
		}
	}
	// The mode came from the user's file too.
	r, _ := ParseRequest("tcp:203.0.113.1:22")
	if d := q.Decide(r); d.Rule != "default deny" {
		t.Errorf("raw IP: %q", d.Rule)
	}
	if !strings.Contains(q.c.modeRule, user+":4:9 network.mode") {
		t.Errorf("mode rule %q", q.c.modeRule)
	}
	// Read as an ordinary file, the comments are only comments.
	o, err := Load(frozen)
	if err != nil || o.Hash != p.Hash {
		t.Fatalf("Load(frozen) = %v, %v", o, err)
	}
	if d := o.Decide(Request{Kind: KindNet, Host: "api.example.com", Port: 443}); !strings.HasPrefix(d.Rule, frozen+":") {
		t.Errorf("an ordinary load honoured frozen comments: %q", d.Rule)
	}
}
