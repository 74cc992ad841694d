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
