package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/errdefs"
)

// limitedBuffer keeps the first max bytes written and counts the rest.
type limitedBuffer struct {
	buf       bytes.Buffer
	max       int
	truncated bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); len(p) > room {
		b.buf.Write(p[:max(room, 0)])
		b.truncated = true
		return len(p), nil
	}
	return b.buf.Write(p)
}

// execBuffered runs a process to its end and answers its output at once:
// for callers that want a result, not a stream (scripts, the MCP server).
func (s *Server) execBuffered(w http.ResponseWriter, r *http.Request) error {
	var req wire.ExecRequest
	if err := readJSON(w, r, &req); err != nil {
		return err
	}
	if len(req.Args) == 0 {
		return fmt.Errorf("args is empty: name the command to run: %w", errdefs.ErrInvalid)
	}
	stdout := &limitedBuffer{max: wire.MaxExecOutput}
	stderr := &limitedBuffer{max: wire.MaxExecOutput}
	sio := ExecIO{Stdout: stdout, Stderr: stderr}
	if req.StdinData != "" {
		sio.Stdin = strings.NewReader(req.StdinData)
	}
	req.Stdin = sio.Stdin != nil
	st, err := s.Backend.Exec(r.Context(), r.PathValue("name"), req, sio)
	if err != nil {
		return err
	}
	return reply(w, http.StatusOK, wire.ExecResult{ExitCode: st.Code, Signal: st.Signal,
		Stdout: stdout.buf.String(), Stderr: stderr.buf.String(), Truncated: stdout.truncated || stderr.truncated}, nil)
}

// wsWriter sends one stream's bytes as binary messages prefixed by the
// stream's number.
type wsWriter struct {
	ctx    context.Context
	c      *websocket.Conn
	stream byte
}

func (w wsWriter) Write(p []byte) (int, error) {
	msg := make([]byte, 1+len(p))
	msg[0] = w.stream
	copy(msg[1:], p)
	if err := w.c.Write(w.ctx, websocket.MessageBinary, msg); err != nil {
		return 0, err
	}
	return len(p), nil
}

func writeControl(ctx context.Context, c *websocket.Conn, m wire.ExecControl) error {
	b, _ := json.Marshal(m)
	return c.Write(ctx, websocket.MessageText, b)
}

// execStream runs a process with its streams on a WebSocket (framing in
// package smx/api). A refusal (no such sandbox, not running) is the
// error message after the upgrade, with its class: checking first would
// cost every exec a second look at the sandbox.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request) error {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return fmt.Errorf("GET exec is a WebSocket (%s): send Upgrade: websocket, or POST for a buffered exec: %w", wire.ExecSubprotocol, errdefs.ErrInvalid)
	}
	name := r.PathValue("name")
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{wire.ExecSubprotocol}})
	if err != nil {
		return nil // Accept has answered
	}
	defer c.CloseNow()
	c.SetReadLimit(MaxBody + 16)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()

	startCtx, startCancel := context.WithTimeout(ctx, 30*time.Second)
	typ, first, err := c.Read(startCtx)
	startCancel()
	if err != nil {
		return nil
	}
	var req wire.ExecRequest
	dec := json.NewDecoder(bytes.NewReader(first))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); typ != websocket.MessageText || err != nil || len(req.Args) == 0 {
		writeControl(ctx, c, wire.ExecControl{Type: "error", Class: wire.ClassInvalid,
			Message: "the first message must be a text ExecRequest with args"})
		c.Close(websocket.StatusPolicyViolation, "bad exec request")
		return nil
	}

	resize := make(chan WindowSize, 4)
	signals := make(chan int, 4)
	sio := ExecIO{
		Stdout: wsWriter{ctx, c, wire.StreamStdout},
		Stderr: wsWriter{ctx, c, wire.StreamStderr},
		Resize: resize, Signal: signals,
		Started: func(pid int) { writeControl(ctx, c, wire.ExecControl{Type: "started", PID: pid}) },
	}
	// Stdin goes through a short queue, so that a process that does not
	// read its input still gets its signals and resizes, which come on the
	// same connection behind the input.
	var stdinQ chan []byte
	if req.Stdin {
		pr, pw := io.Pipe()
		sio.Stdin = pr
		defer pr.Close() // a write nobody reads any more ends
		stdinQ = make(chan []byte, 16)
		go func() {
			defer pw.Close()
			for p := range stdinQ {
				if p == nil {
					return // stdin_eof
				}
				if _, err := pw.Write(p); err != nil {
					for range stdinQ { // the process closed its stdin
					}
					return
				}
			}
		}()
	}
	closeStdin := func() {
		if stdinQ != nil {
			select {
			case stdinQ <- nil:
			case <-ctx.Done():
			}
		}
	}
	var readerDone sync.WaitGroup
	readerDone.Add(1)
	go func() {
		defer readerDone.Done()
		// The client going away (or breaking the protocol) ends the
		// process: cancelling ctx closes the supervisor stream, and the
		// guest kills the process.
		defer cancel()
		if stdinQ != nil {
			defer close(stdinQ)
		}
		stdinDone := false
		for {
			typ, p, err := c.Read(ctx)
			if err != nil {
				return
			}
			if typ == websocket.MessageBinary {
				if stdinQ == nil || stdinDone || len(p) == 0 {
					continue // stdin was not asked for, or is closed
				}
				select {
				case stdinQ <- p:
				case <-ctx.Done():
					return
				}
				continue
			}
			var m wire.ExecControl
			if json.Unmarshal(p, &m) != nil {
				return
			}
			switch m.Type {
			case "stdin_eof":
				if !stdinDone {
					stdinDone = true
					closeStdin()
				}
			case "resize":
				select {
				case resize <- WindowSize{Rows: m.Rows, Cols: m.Cols}:
				default:
				}
			case "signal":
				select {
				case signals <- m.Signal:
				default:
				}
			}
		}
	}()
	st, err := s.Backend.Exec(ctx, name, req, sio)
	if ctx.Err() != nil {
		return nil // the client went away: the process is gone with it
	}
	if err != nil {
		e := s.errorBody(err)
		writeControl(ctx, c, wire.ExecControl{Type: "error", Class: e.Class, Message: e.Message, ExitCode: e.ExitCode})
	} else {
		writeControl(ctx, c, wire.ExecControl{Type: "exit", Code: st.Code, Signal: st.Signal})
	}
	c.Close(websocket.StatusNormalClosure, "")
	cancel()
	readerDone.Wait()
	return nil
}

// lazyWriter sends the response header with the first byte, so that a
// failure before any data is still an ordinary JSON error.
type lazyWriter struct {
	w           http.ResponseWriter
	contentType string
	started     bool
	flush       bool
}

func (l *lazyWriter) start() {
	if !l.started {
		l.started = true
		l.w.Header().Set("Content-Type", l.contentType)
		l.w.WriteHeader(http.StatusOK)
	}
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	l.start()
	n, err := l.w.Write(p)
	if l.flush {
		http.NewResponseController(l.w).Flush()
	}
	return n, err
}

// abort ends a response whose header is out: the client sees a cut
// stream rather than a whole one.
func (l *lazyWriter) abort(err error) error {
	if !l.started {
		return err
	}
	panic(http.ErrAbortHandler)
}

func (s *Server) copyOut(w http.ResponseWriter, r *http.Request) error {
	path := r.URL.Query().Get("path")
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("path %q: want an absolute guest path: %w", path, errdefs.ErrInvalid)
	}
	lw := &lazyWriter{w: w, contentType: "application/x-tar"}
	if err := s.Backend.CopyOut(r.Context(), r.PathValue("name"), path, lw); err != nil {
		return lw.abort(err)
	}
	lw.start()
	return nil
}

func parseSince(v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		return time.Now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("since %q: want a duration like 30m or a time like 2026-01-02T15:04:05Z: %w", v, errdefs.ErrInvalid)
}

// logs streams records as JSON lines; with follow=true it goes on until
// the client leaves.
func (s *Server) logs(w http.ResponseWriter, r *http.Request) error {
	var q LogQuery
	var err error
	if q.Follow, err = boolQuery(r, "follow"); err != nil {
		return err
	}
	if q.Refusals, err = boolQuery(r, "refusals"); err != nil {
		return err
	}
	if q.Since, err = parseSince(r.URL.Query().Get("since")); err != nil {
		return err
	}
	lw := &lazyWriter{w: w, contentType: "application/x-ndjson", flush: q.Follow}
	enc := json.NewEncoder(lw)
	if q.Follow {
		q.Ready = func() { lw.start(); http.NewResponseController(w).Flush() }
	}
	err = s.Backend.Logs(r.Context(), r.PathValue("name"), q, func(rec wire.Record) error { return enc.Encode(rec) })
	if err != nil && !(errors.Is(err, context.Canceled) && r.Context().Err() != nil) {
		return lw.abort(err)
	}
	lw.start()
	return nil
}

func (s *Server) events(w http.ResponseWriter, r *http.Request) error {
	q := EventQuery{Sandboxes: r.URL.Query()["sandbox"]}
	var err error
	if q.All, err = boolQuery(r, "all"); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	rc.Flush()
	enc := json.NewEncoder(w)
	err = s.Backend.Events(r.Context(), q, func(ev wire.Event) error {
		if err := enc.Encode(ev); err != nil {
			return err
		}
		return rc.Flush()
	})
	if err != nil && r.Context().Err() == nil {
		s.Log.Warn("events stream ended", "err", err)
	}
	return nil
}
