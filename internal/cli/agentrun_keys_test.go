package cli

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestParseDetachKeys(t *testing.T) {
	for in, want := range map[string]string{
		"ctrl-p,ctrl-q":  "\x10\x11",
		"ctrl-a,d":       "\x01d",
		"ctrl-[":         "\x1b",
		"ctrl-P, ctrl-Q": "\x10\x11",
	} {
		got, err := parseDetachKeys(in)
		if err != nil || string(got) != want {
			t.Errorf("parseDetachKeys(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "ctrl-", "ctrl-1", "alt-x", "ab"} {
		if _, err := parseDetachKeys(bad); err == nil {
			t.Errorf("parseDetachKeys(%q) accepted", bad)
		}
	}
}

// The detach keys end the copy; bytes that only begin the sequence reach
// the agent once the sequence breaks, as in container runtimes.
func TestCopyUntilKeys(t *testing.T) {
	keys := []byte{0x10, 0x11}
	for _, c := range []struct {
		in, out string
		detach  bool
	}{
		{"hello", "hello", false},
		{"ab\x10\x11cd", "ab", true},
		{"a\x10b\x11", "a\x10b\x11", false},
		{"\x10\x10\x11rest", "\x10", true},
		{"x\x10", "x", false}, // a held prefix at end of input is dropped with the input
	} {
		var out bytes.Buffer
		err := copyUntilKeys(&out, strings.NewReader(c.in), keys)
		if errors.Is(err, errDetach) != c.detach || out.String() != c.out {
			t.Errorf("%q: out %q err %v; want %q detach %v", c.in, out.String(), err, c.out, c.detach)
		}
	}
}

func TestImageNameFromRef(t *testing.T) {
	for in, want := range map[string]string{
		"debian:bookworm":                                 "debian-bookworm",
		"ghcr.io/acme/tools/app:v1.2":                     "app-v1.2",
		"localhost:5000/team/app":                         "app",
		"registry.example/x@sha256:" + "ab12cd34ef56aaaa": "x-ab12cd34ef56",
		"Ubuntu:24.04":                                    "ubuntu-24.04",
	} {
		if got := imageNameFromRef(in); got != want {
			t.Errorf("imageNameFromRef(%q) = %q, want %q", in, got, want)
		}
	}
}

// A preset's mounts show the host user's files as the preset user's,
// unless a -v names its own owner.
func TestOwnedMount(t *testing.T) {
	for _, c := range [][2]string{
		{"/src:/work", "/src:/work:uid=1000,gid=1000"},
		{"/src:/data:ro", "/src:/data:ro,uid=1000,gid=1000"},
		{"/src:/data:uid=0", "/src:/data:uid=0"},
		{"/src:/data:ro,gid=5", "/src:/data:ro,gid=5"},
		{"bad", "bad"},
	} {
		if got := ownedMount(c[0], 1000, 1000); got != c[1] {
			t.Errorf("ownedMount(%q) = %q, want %q", c[0], got, c[1])
		}
	}
	if got := ownedMount("/src:/work", 0, 0); got != "/src:/work" {
		t.Errorf("root preset: %q", got)
	}
}
