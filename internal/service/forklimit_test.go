package service

import (
	"testing"
	"time"
)

// TestForkLimit: a fork keeps its snapshot's limit unless the restore
// sets one; "0" removes it; a bad override is refused, not ignored.
func TestForkLimit(t *testing.T) {
	for _, c := range []struct {
		inherited, override string
		want                time.Duration
		bad                 bool
	}{
		{"", "", 0, false},
		{"10m", "", 10 * time.Minute, false},
		{"10m", "1h", time.Hour, false},
		{"", "45s", 45 * time.Second, false},
		{"10m", "0", 0, false},
		{"10m", "0s", 0, true},
		{"10m", "soon", 0, true},
	} {
		got, err := forkLimit("--timeout", c.inherited, c.override)
		if (err != nil) != c.bad || time.Duration(got) != c.want {
			t.Errorf("forkLimit(%q, %q) = %v, %v", c.inherited, c.override, got, err)
		}
	}
}
