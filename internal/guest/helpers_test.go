package guest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/smx-dev/smx/internal/agentproto"
)

var (
	testReaperOnce sync.Once
	testReaper     *Reaper
)

// sharedReaper is one reaper for the whole test binary, in own-children
// mode so it never steals statuses from anything else in the process.
func sharedReaper() *Reaper {
	testReaperOnce.Do(func() { testReaper = NewReaper(false) })
	return testReaper
}

// testLogWriter sends server logs to t.Log until the test is over; server
// goroutines may outlive it by a little, and t.Log would then panic.
type testLogWriter struct {
	t    testing.TB
	mu   sync.Mutex
	done bool
}

func newTestLogWriter(t testing.TB) *testLogWriter {
	w := &testLogWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return w
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// startServer serves a Server on one end of a socket pair and returns a
// yamux client session on the other, as the host would have.
func startServer(t *testing.T, configure ...func(*Server)) *yamux.Session {
	t.Helper()
	hostEnd, guestEnd := socketPair(t)
	srv := &Server{
		Log:          slog.New(slog.NewTextHandler(newTestLogWriter(t), &slog.HandlerOptions{Level: slog.LevelDebug})),
		Reaper:       sharedReaper(),
		DrainTimeout: time.Second,
	}
	for _, c := range configure {
		c(srv)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, guestEnd); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	sess, err := yamux.Client(hostEnd, YamuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sess.Close()
		cancel()
		<-done
	})
	return sess
}

func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("unix", t.TempDir()+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- nil
			return
		}
		ch <- c
	}()
	a, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-ch
	if b == nil {
		t.Fatal("accept failed")
	}
	return a, b
}

func openRequest(t *testing.T, sess *yamux.Session, req agentproto.Request) net.Conn {
	t.Helper()
	st, err := sess.OpenStream()
	if err != nil {
		t.Fatal(err)
	}
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, req); err != nil {
		t.Fatal(err)
	}
	return st
}

// execResult is everything a host sees of one exec.
type execResult struct {
	Started bool
	PID     int
	Stdout  bytes.Buffer
	Stderr  bytes.Buffer
	Exit    *agentproto.ExitStatus
	Err     error // FrameError from the guest
}

// readExec reads exec frames until FrameExit or FrameError. onOutput, if
// set, sees the stdout collected so far after every stdout frame.
func readExec(t *testing.T, st io.Reader, onStarted func(pid int), onOutput func(stdout string)) *execResult {
	t.Helper()
	res := &execResult{}
	for {
		typ, p, err := agentproto.ReadFrame(st, nil)
		if err != nil {
			t.Fatalf("read frame: %v (stdout so far %q)", err, res.Stdout.String())
		}
		switch typ {
		case agentproto.FrameStarted:
			var s agentproto.Started
			if err := json.Unmarshal(p, &s); err != nil {
				t.Fatal(err)
			}
			res.Started, res.PID = true, s.PID
			if onStarted != nil {
				onStarted(s.PID)
			}
		case agentproto.FrameStdout:
			res.Stdout.Write(p)
			if onOutput != nil {
				onOutput(res.Stdout.String())
			}
		case agentproto.FrameStderr:
			res.Stderr.Write(p)
		case agentproto.FrameExit:
			var e agentproto.ExitStatus
			if err := json.Unmarshal(p, &e); err != nil {
				t.Fatal(err)
			}
			res.Exit = &e
			return res
		case agentproto.FrameError:
			res.Err = agentproto.DecodeError(p)
			return res
		default:
			t.Fatalf("unexpected frame %s", typ)
		}
	}
}

// run executes req with optional stdin and waits for the end.
func run(t *testing.T, sess *yamux.Session, req agentproto.ExecRequest, stdin []byte) *execResult {
	t.Helper()
	if stdin != nil {
		req.Stdin = true
	}
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpExec, Exec: &req})
	defer st.Close()
	if stdin != nil {
		go func() {
			_, _ = agentproto.FrameWriter{W: st, Type: agentproto.FrameStdin}.Write(stdin)
			_ = agentproto.WriteFrame(st, agentproto.FrameStdinEOF, nil)
		}()
	}
	return readExec(t, st, nil, nil)
}

func mustExit(t *testing.T, r *execResult, code int) {
	t.Helper()
	if r.Err != nil {
		t.Fatalf("exec failed: %v", r.Err)
	}
	if r.Exit == nil || r.Exit.Code != code {
		t.Fatalf("exit = %+v, want code %d; stdout %q stderr %q", r.Exit, code, r.Stdout.String(), r.Stderr.String())
	}
}

// result reads the single FrameResult (or FrameError) of a one-shot request.
func result(t *testing.T, st io.Reader) (*agentproto.Result, error) {
	t.Helper()
	typ, p, err := agentproto.ReadFrame(st, nil)
	if err != nil {
		t.Fatalf("read frame: %v", err)
	}
	switch typ {
	case agentproto.FrameResult:
		var r agentproto.Result
		if err := json.Unmarshal(p, &r); err != nil {
			t.Fatal(err)
		}
		return &r, nil
	case agentproto.FrameError:
		return nil, agentproto.DecodeError(p)
	}
	t.Fatalf("unexpected frame %s", typ)
	return nil, errors.New("unreachable")
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}
