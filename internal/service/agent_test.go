package service

import (
	"slices"
	"testing"
)

// TestLineWriter: image build output reaches the progress callback one
// line at a time, whatever the write boundaries; carriage returns (progress
// bars) end lines, blank lines are dropped, a last partial line is flushed.
func TestLineWriter(t *testing.T) {
	var got []string
	w := &lineWriter{fn: func(l string) { got = append(got, l) }}
	for _, p := range []string{"Get:1 http", "://deb bookworm\nGet:2", " x\n\n", "10%\r20%\r", "done"} {
		w.Write([]byte(p))
	}
	w.flush()
	want := []string{"Get:1 http://deb bookworm", "Get:2 x", "10%", "20%", "done"}
	if !slices.Equal(got, want) {
		t.Errorf("lines = %q, want %q", got, want)
	}
}

// TestOwnedMountService: the preset's user owns the workspace and extra
// mounts unless a mount names its own owner.
func TestOwnedMountService(t *testing.T) {
	for _, c := range [][2]string{
		{"/src:/work", "/src:/work:uid=1000,gid=1000"},
		{"/src:/work:ro", "/src:/work:ro,uid=1000,gid=1000"},
		{"/src:/work:uid=5", "/src:/work:uid=5"},
	} {
		if got := OwnedMount(c[0], 1000, 1000); got != c[1] {
			t.Errorf("OwnedMount(%q) = %q, want %q", c[0], got, c[1])
		}
	}
}
