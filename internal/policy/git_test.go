package policy

import (
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
