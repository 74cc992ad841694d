package policy

import (
	"strings"
	"testing"
	"time"
)

func TestMatchSegments(t *testing.T) {
	for _, c := range []struct {
		pat, s string
		want   bool
	}{
		{"/", "/", true},
		{"/", "/a", false},
		{"/**", "/", true},
		{"/**", "/a/b", true},
		{"/a/**", "/a", true},
		{"/a/**", "/ab", false},
		{"/a/**/b", "/a/b", true},
		{"/a/**/b", "/a/x/y/b", true},
		{"/a/**/b", "/a/x/y/bc", false},
		{"/a/**/b/**", "/a/x/b/y/z", true},
		{"/**/x/**/y", "/x/x/x/y", true},
		{"/**/x/**/y", "/y/x", false},
		{"/a/*", "/a/b", true},
		{"/a/*", "/a/b/c", false},
		{"/a/*.pem", "/a/.pem", true},
		{"/a/k?y", "/a/key", true},
		{"/a/k?y", "/a/ky", false},
		{"/a/k?y", "/a/kéy", true},
		{"/a/*b*c", "/a/xxbyyc", true},
		{"/a/*b*c", "/a/xxbyyd", false},
	} {
		if got := matchSegments(splitGlob(c.pat), strings.TrimPrefix(c.s, "/")); got != c.want {
			t.Errorf("match(%q, %q) = %v; want %v", c.pat, c.s, got, c.want)
		}
	}
}

// A guest controls request paths: the worst case must stay cheap.
func TestMatchSegmentsWorstCase(t *testing.T) {
	pat := splitGlob("/**/a*a*a*a*b/**/a/**/b/**/c")
	s := strings.Repeat("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/", 110) + "x"
	start := time.Now()
	for range 10 {
		if matchSegments(pat, s) {
			t.Fatal("matched")
		}
	}
	if d := time.Since(start) / 10; d > 5*time.Millisecond {
		t.Errorf("worst case took %v", d)
	}
}
