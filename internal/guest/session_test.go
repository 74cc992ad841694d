package guest

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/smx-dev/smx/internal/agentproto"
)

// A detach is answered, then ends the session: Serve returns, and the
// host's session sees its end.
func TestDetachEndsSession(t *testing.T) {
	hostEnd, guestEnd := socketPair(t)
	srv := &Server{Log: slog.New(slog.NewTextHandler(newTestLogWriter(t), nil)), Reaper: sharedReaper()}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), guestEnd) }()
	sess, err := yamux.Client(hostEnd, YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpDetach})
	if r, err := result(t, st); err != nil || !r.OK {
		t.Fatalf("detach: %v %+v", err, r)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve after detach: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the session outlived its detach")
	}
	select {
	case <-sess.CloseChan():
	case <-time.After(10 * time.Second):
		t.Fatal("the host's session did not see the end")
	}
}

// A detach outside a session (ServeStream called directly) is refused.
func TestDetachOutsideSession(t *testing.T) {
	hostEnd, guestEnd := socketPair(t)
	srv := &Server{Log: slog.New(slog.NewTextHandler(newTestLogWriter(t), nil)), Reaper: sharedReaper()}
	go srv.ServeStream(context.Background(), guestEnd)
	if err := agentproto.WriteJSON(hostEnd, agentproto.FrameRequest, agentproto.Request{Op: agentproto.OpDetach}); err != nil {
		t.Fatal(err)
	}
	if _, err := result(t, hostEnd); err == nil || !strings.Contains(err.Error(), "not in a session") {
		t.Fatalf("detach outside a session: %v", err)
	}
}

// awaitKnock returns at the first poison byte, whatever came before it,
// and fails when the channel ends without one.
func TestAwaitKnock(t *testing.T) {
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- awaitKnock(r) }()
	w.Write([]byte("stale tail of an old session\x00\x01"))
	select {
	case err := <-done:
		t.Fatalf("returned before the knock: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	w.Write([]byte{agentproto.SessionPoison, agentproto.SessionPoison})
	if err := <-done; err != nil {
		t.Fatalf("after the knock: %v", err)
	}

	r, w = io.Pipe()
	go func() { done <- awaitKnock(r) }()
	w.Write([]byte("no knock"))
	w.Close()
	if err := <-done; err == nil {
		t.Fatal("a channel that ended without a knock counted as one")
	}
}
