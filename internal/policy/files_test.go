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
