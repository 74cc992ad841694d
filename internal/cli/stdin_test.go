package cli

import (
	"io"
	"os"
	"testing"
	"time"
)

// An exec's stdin copier must end with the exec, not at the next line the
// user types: stdinUntil's Read returns once done is closed.
func TestStdinUntilEndsBlockedRead(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	done := make(chan struct{})
	in := stdinUntil(r, done)
	w.Write([]byte("hi"))
	buf := make([]byte, 8)
	if n, err := in.Read(buf); err != nil || string(buf[:n]) != "hi" {
		t.Fatalf("Read = %q, %v; want hi", buf[:n], err)
	}
	got := make(chan error, 1)
	go func() { _, err := in.Read(buf); got <- err }() // blocks: nothing written
	time.Sleep(50 * time.Millisecond)
	close(done)
	select {
	case err := <-got:
		if err != io.EOF {
			t.Fatalf("Read after done = %v, want io.EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still blocked after done was closed")
	}
	if _, err := in.Read(buf); err != io.EOF {
		t.Fatalf("second Read after done = %v, want io.EOF", err)
	}
}
