package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	"github.com/smx-dev/smx/api"
)

// ExecIO wires a process's streams for Exec. A nil Stdin gives the
// process no input; Signal and Resize may be nil.
type ExecIO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Signal <-chan int // signal numbers to deliver to the process
	Resize <-chan [2]uint16
	// Started, if set, is called with the guest PID.
	Started func(pid int)
}

// ExitStatus is how a process ended: Code is 128+Signal when killed.
type ExitStatus struct{ Code, Signal int }

// ExecError is a command that could not start: ExitCode 127 (not found) or
// 126 (not executable).
type ExecError struct {
	ExitCode int
	Message  string
}

func (e *ExecError) Error() string { return e.Message }

// Exec runs a process in a running sandbox with its streams over a
// WebSocket and returns how it ended, once all its output is written.
// Cancelling ctx closes the connection, which kills the process.
func (c *Client) Exec(ctx context.Context, name string, req ExecRequest, sio ExecIO) (ExitStatus, error) {
	hdr := http.Header{}
	if c.token != "" {
		hdr.Set("Authorization", "Bearer "+c.token)
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return c.dial(ctx) },
	}}
	u := "ws" + c.base[len("http"):] + sb(name) + "/exec"
	conn, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: hdr, Subprotocols: []string{api.ExecSubprotocol}})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return ExitStatus{}, decodeError(resp)
		}
		return ExitStatus{}, fmt.Errorf("smx api: exec: %w", err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(4 << 20)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req.Stdin = sio.Stdin != nil
	first, _ := json.Marshal(req)
	if err := conn.Write(ctx, websocket.MessageText, first); err != nil {
		return ExitStatus{}, fmt.Errorf("smx api: exec: %w", err)
	}
	control := func(m api.ExecControl) error {
		b, _ := json.Marshal(m)
		return conn.Write(ctx, websocket.MessageText, b)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if sio.Stdin != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := sio.Stdin.Read(buf)
				if n > 0 {
					if conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
						return
					}
				}
				if err == io.EOF {
					control(api.ExecControl{Type: "stdin_eof"})
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	if sio.Signal != nil || sio.Resize != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case s, ok := <-sio.Signal:
					if !ok {
						sio.Signal = nil
						continue
					}
					control(api.ExecControl{Type: "signal", Signal: s})
				case sz, ok := <-sio.Resize:
					if !ok {
						sio.Resize = nil
						continue
					}
					control(api.ExecControl{Type: "resize", Rows: sz[0], Cols: sz[1]})
				}
			}
		}()
	}
	stdout, stderr := sio.Stdout, sio.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	for {
		typ, p, err := conn.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ExitStatus{}, ctx.Err()
			}
			return ExitStatus{}, fmt.Errorf("smx api: exec: connection lost before the process exited: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(p) == 0 {
				continue
			}
			w := stdout
			if p[0] == api.StreamStderr {
				w = stderr
			}
			if _, err := w.Write(p[1:]); err != nil {
				return ExitStatus{}, fmt.Errorf("smx api: exec: write output: %w", err)
			}
			continue
		}
		var m api.ExecControl
		if err := json.Unmarshal(p, &m); err != nil {
			return ExitStatus{}, fmt.Errorf("smx api: exec: bad control message: %w", err)
		}
		switch m.Type {
		case "started":
			if sio.Started != nil {
				sio.Started(m.PID)
			}
		case "exit":
			conn.Close(websocket.StatusNormalClosure, "")
			return ExitStatus{Code: m.Code, Signal: m.Signal}, nil
		case "error":
			if m.ExitCode != 0 {
				return ExitStatus{}, &ExecError{ExitCode: m.ExitCode, Message: m.Message}
			}
			return ExitStatus{}, &APIError{Status: StatusOfClass(m.Class), Class: m.Class, Message: m.Message}
		}
	}
}

// StatusOfClass is the HTTP status the server gives an error class.
func StatusOfClass(class string) int {
	switch class {
	case api.ClassNotFound:
		return 404
	case api.ClassExists, api.ClassInUse:
		return 409
	case api.ClassInvalid:
		return 400
	case api.ClassTooLarge:
		return 413
	case api.ClassUnavailable:
		return 503
	case api.ClassDenied:
		return 403
	case api.ClassFailed:
		return 412
	}
	return 500
}
