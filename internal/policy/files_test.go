package policy

import (
	"strings"
	"testing"
)

func TestDecideMounted(t *testing.T) {
	p, err := Parse("t.yaml", []byte(`files:
  rules:
    - path: /work/.env
      access: deny
    - path: /work/.github/**
      access: ro
    - path: /work/gen/**
      access: rw
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	rw := FileMount{Guest: "/work", Rule: "-v /h:/work"}
	ro := FileMount{Guest: "/work", ReadOnly: true, Rule: "-v /h:/work:ro"}
	for _, c := range []struct {
		m      FileMount
		path   string
		access string
		allow  bool
		rule   string
	}{
		{rw, "/work/src/a.go", "rw", true, "-v /h:/work"},              // no rule: the mount's mode
		{rw, "/work", "ro", true, "-v /h:/work"},                       // the mount point itself
		{rw, "/work/.env", "ro", false, "t.yaml:3:7"},                  // deny beats the mount
		{rw, "/work/.github/ci.yml", "rw", false, "t.yaml:5:7"},        // ro rule under a rw mount
		{rw, "/work/.github/ci.yml", "ro", true, "t.yaml:5:7"},         //
		{ro, "/work/src/a.go", "rw", false, "-v /h:/work:ro"},          // ro mount, no rule
		{ro, "/work/gen/x", "rw", false, "-v /h:/work:ro"},             // ro mount beats a rw rule
		{ro, "/work/gen/x", "ro", true, "t.yaml:7:7"},                  //
		{rw, "/work/../etc/passwd", "ro", false, "builtin: malformed"}, // never guessed at
		{rw, "/workshop/x", "ro", false, "default deny"},               // not under the mount
	} {
		d := p.DecideMounted(c.m, c.path, c.access)
		if d.Allow != c.allow || !strings.HasPrefix(d.Rule, c.rule) || d.Reason == "" {
			t.Errorf("%s %s on %s: got %+v, want allow=%v rule %s...", c.access, c.path, c.m.Rule, d, c.allow, c.rule)
		}
	}
}

// TestDecideMountedFoldCase: on a host folder that compares names
// case-insensitively, rules match every spelling the host takes for the
// same name, and the case-sensitive decision still holds.
func TestDecideMountedFoldCase(t *testing.T) {
	p, err := Parse("t.yaml", []byte(`files:
  rules:
    - path: /work/.env
      access: deny
    - path: /work/**/*.pem
      access: deny
    - path: /work/.github/**
      access: ro
    - path: /work/a?c
      access: deny
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	fold := FileMount{Guest: "/work", Rule: "-v /h:/work", FoldCase: true}
	plain := FileMount{Guest: "/work", Rule: "-v /h:/work"}
	for _, c := range []struct {
		path, access string
		allow        bool // with FoldCase
	}{
		{"/work/.ENV", "ro", false},
		{"/work/.Env", "ro", false},
		{"/work/src/KEY.PEM", "ro", false},
		{"/work/src/key.Pem", "rw", false},
		{"/work/.GitHub/ci.yml", "rw", false},
		{"/work/.GitHub/ci.yml", "ro", true},
		{"/work/.e\u200dnv", "ro", false}, // ignorable code point
		{"/work/.\u0395nv", "ro", true},   // Greek capital epsilon: another letter
		{"/work/a\u00dfc", "ro", false},   // ß: ? matches it unfolded
		{"/work/src/a.go", "rw", true},
	} {
		if d := p.DecideMounted(fold, c.path, c.access); d.Allow != c.allow {
			t.Errorf("fold: %s %s = %v (%s), want %v", c.access, c.path, d.Allow, d.Reason, c.allow)
		}
	}
	// Without FoldCase, names are compared as the host compares them on
	// a case-sensitive folder.
	if d := p.DecideMounted(plain, "/work/.ENV", "ro"); !d.Allow {
		t.Errorf("plain: /work/.ENV denied: %s", d.Reason)
	}
	if d := p.DecideMounted(fold, "/work/.ENV", "ro"); !strings.Contains(d.Rule, "t.yaml:3:7") || !strings.Contains(d.Reason, "case-insensitively") {
		t.Errorf("fold: /work/.ENV decided by %q: %s", d.Rule, d.Reason)
	}
}
