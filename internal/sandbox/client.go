package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/supproto"
)

// Client talks to one sandbox's supervisor over its unix socket. Every call
// is one connection, which the supervisor relays to one stream to the guest
// agent. A Client is safe for concurrent use.
type Client struct{ Paths Paths }

// DialSocket connects to a unix socket, working around the 108-byte limit
// on socket paths by going through /proc/self/fd when the path is long.
func DialSocket(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) < 100 {
		return d.DialContext(ctx, "unix", path)
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	return d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path)))
}

func (c *Client) dial(ctx context.Context, req *supproto.Request) (net.Conn, error) {
	conn, err := DialSocket(ctx, c.Paths.Socket())
	if err != nil {
		return nil, fmt.Errorf("sandbox %s is not running (start it with `smx agent start %s`): %w", filepath.Base(c.Paths.Dir), filepath.Base(c.Paths.Dir), errdefs.ErrFailed)
	}
	if err := supproto.WriteRequest(conn, req); err != nil {
		conn.Close()
		return nil, fmt.Errorf("sandbox: send request: %w", err)
	}
	// Cancelling ctx breaks the connection, which the supervisor turns into
	// the guest killing the process.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	return &ctxConn{Conn: conn, stop: stop}, nil
}

type ctxConn struct {
	net.Conn
	stop func() bool
}

func (c *ctxConn) Close() error { c.stop(); return c.Conn.Close() }

// result reads the single FrameResult answer of a one-shot request.
func result(conn net.Conn) (*supproto.Result, error) {
	r, err := supproto.ReadResult(conn)
	var perr *agentproto.Error
	if err != nil && !errors.As(err, &perr) {
		return nil, fmt.Errorf("sandbox: no answer from guest agent: %w", err)
	}
	return r, err
}

func (c *Client) oneShot(ctx context.Context, req *supproto.Request) (*supproto.Result, error) {
	conn, err := c.dial(ctx, req)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r, err := result(conn)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return r, err
}

// Health asks the guest agent for its health.
func (c *Client) Health(ctx context.Context) (*supproto.Result, error) {
	return c.oneShot(ctx, &supproto.Request{Op: supproto.OpHealth})
}

// Stop asks the supervisor to power the guest off within timeout and exit.
func (c *Client) Stop(ctx context.Context, timeout time.Duration) error {
	_, err := c.oneShot(ctx, &supproto.Request{Op: supproto.OpStop, TimeoutMS: timeout.Milliseconds()})
	return err
}

// Discard asks the supervisor to end a throwaway sandbox: it answers
// once the sandbox reads removing, and finishes (stop and removal
// logged, log closed, directory deleted) after the answer, before it
// exits.
func (c *Client) Discard(ctx context.Context) error {
	_, err := c.oneShot(ctx, &supproto.Request{Op: supproto.OpDiscard})
	return err
}

// ExecIO wires a process's streams. Nil Stdin means no stdin; Resize and
// Signal may be nil.
type ExecIO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	Resize <-chan agentproto.WindowSize
	Signal <-chan int
	// Started, if set, is called with the guest PID.
	Started func(pid int)
}

// Exec runs a process in the guest and returns how it ended. It returns
// when the process has exited and all its output has been written.
func (c *Client) Exec(ctx context.Context, req supproto.ExecRequest, sio ExecIO) (agentproto.ExitStatus, error) {
	return c.ExecLabeled(ctx, req, sio, "")
}

// ExecLabeled is Exec with the label the supervisor logs it under ("run"
// for the command of `smx run`; "" for an exec).
func (c *Client) ExecLabeled(ctx context.Context, req supproto.ExecRequest, sio ExecIO, label string) (agentproto.ExitStatus, error) {
	req.Stdin = sio.Stdin != nil
	conn, err := c.dial(ctx, &supproto.Request{Op: supproto.OpExec, Exec: &req, Audit: label})
	if err != nil {
		return agentproto.ExitStatus{}, err
	}
	defer conn.Close()
	w := &agentproto.LockedWriter{W: conn}
	done := make(chan struct{})
	defer close(done)
	if sio.Stdin != nil {
		go func() {
			_, err := io.Copy(agentproto.FrameWriter{W: w, Type: agentproto.FrameStdin}, sio.Stdin)
			if err == nil {
				agentproto.WriteFrame(w, agentproto.FrameStdinEOF, nil)
			}
		}()
	}
	if sio.Resize != nil || sio.Signal != nil {
		go func() {
			for {
				select {
				case <-done:
					return
				case sz, ok := <-sio.Resize:
					if !ok {
						sio.Resize = nil
						continue
					}
					agentproto.WriteJSON(w, agentproto.FrameResize, sz)
				case sig, ok := <-sio.Signal:
					if !ok {
						sio.Signal = nil
						continue
					}
					agentproto.WriteJSON(w, agentproto.FrameSignal, agentproto.Signal{Signal: sig})
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
	buf := make([]byte, agentproto.DataChunk)
	for {
		t, p, err := agentproto.ReadFrame(conn, buf)
		if err != nil {
			if ctx.Err() != nil {
				return agentproto.ExitStatus{}, ctx.Err()
			}
			return agentproto.ExitStatus{}, fmt.Errorf("sandbox: exec: connection to guest lost before the process exited: %w", err)
		}
		switch t {
		case agentproto.FrameStarted:
			var s agentproto.Started
			json.Unmarshal(p, &s)
			if sio.Started != nil {
				sio.Started(s.PID)
			}
		case agentproto.FrameStdout:
			if _, err := stdout.Write(p); err != nil {
				return agentproto.ExitStatus{}, fmt.Errorf("sandbox: exec: write stdout: %w", err)
			}
		case agentproto.FrameStderr:
			if _, err := stderr.Write(p); err != nil {
				return agentproto.ExitStatus{}, fmt.Errorf("sandbox: exec: write stderr: %w", err)
			}
		case agentproto.FrameExit:
			var es agentproto.ExitStatus
			if err := json.Unmarshal(p, &es); err != nil {
				return es, fmt.Errorf("sandbox: exec: bad exit frame: %w", err)
			}
			return es, nil
		case agentproto.FrameError:
			return agentproto.ExitStatus{}, agentproto.DecodeError(p)
		}
	}
}

// CopyIn extracts a tar stream into dir in the guest.
func (c *Client) CopyIn(ctx context.Context, dir string, tarStream io.Reader) (int64, error) {
	conn, err := c.dial(ctx, &supproto.Request{Op: supproto.OpCopyIn, Path: dir})
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	// Read the answer concurrently: the guest may refuse early (bad path)
	// while we are still sending.
	type res struct {
		r   *supproto.Result
		err error
	}
	ch := make(chan res, 1)
	go func() { r, err := result(conn); ch <- res{r, err} }()
	sendErr := func() error {
		if _, err := io.Copy(agentproto.FrameWriter{W: conn, Type: agentproto.FrameData}, tarStream); err != nil {
			return err
		}
		return agentproto.WriteFrame(conn, agentproto.FrameEOF, nil)
	}()
	r := <-ch
	if r.err != nil {
		return 0, r.err
	}
	if sendErr != nil {
		return 0, fmt.Errorf("sandbox: copy in: %w", sendErr)
	}
	return r.r.Bytes, nil
}

// CopyOut writes a tar stream of path in the guest to w.
func (c *Client) CopyOut(ctx context.Context, path string, w io.Writer) error {
	conn, err := c.dial(ctx, &supproto.Request{Op: supproto.OpCopyOut, Path: path})
	if err != nil {
		return err
	}
	defer conn.Close()
	buf := make([]byte, agentproto.DataChunk)
	for {
		t, p, err := agentproto.ReadFrame(conn, buf)
		if err != nil {
			return fmt.Errorf("sandbox: copy out: %w", err)
		}
		switch t {
		case agentproto.FrameData:
			if _, err := w.Write(p); err != nil {
				return fmt.Errorf("sandbox: copy out: %w", err)
			}
		case agentproto.FrameEOF:
			return nil
		case agentproto.FrameError:
			return agentproto.DecodeError(p)
		default:
			return errors.New("sandbox: copy out: unexpected frame " + t.String())
		}
	}
}

// Pause stops the guest's vCPUs; its memory stays in place.
func (c *Client) Pause(ctx context.Context) (*supproto.Result, error) {
	return c.oneShot(ctx, &supproto.Request{Op: supproto.OpPause})
}

// Resume continues a paused guest.
func (c *Client) Resume(ctx context.Context) (*supproto.Result, error) {
	return c.oneShot(ctx, &supproto.Request{Op: supproto.OpResume})
}

// Suspend saves the guest's state to the sandbox directory; QEMU and the
// supervisor then exit.
func (c *Client) Suspend(ctx context.Context) (*supproto.Result, error) {
	return c.oneShot(ctx, &supproto.Request{Op: supproto.OpSuspend})
}

// Snapshot saves memory, devices and disk as snapshot name; with stop the
// sandbox stops afterwards, else it keeps running.
func (c *Client) Snapshot(ctx context.Context, name string, stop bool) (*supproto.Result, error) {
	return c.oneShot(ctx, &supproto.Request{Op: supproto.OpSnapshot, Snapshot: name, StopAfter: stop})
}

// CopyRefused has the supervisor log that the host refused the guest's
// stream for a copy out of path, and why.
func (c *Client) CopyRefused(ctx context.Context, path, reason string) error {
	_, err := c.oneShot(ctx, &supproto.Request{Op: supproto.OpCopyRefused, Path: path, Reason: reason})
	return err
}

// SetProfile asks the supervisor to apply the sandbox's profile.yaml to
// new and live flows; it returns how many live flows were closed.
func (c *Client) SetProfile(ctx context.Context) (int, error) {
	r, err := c.oneShot(ctx, &supproto.Request{Op: supproto.OpSetProfile})
	if err != nil {
		return 0, err
	}
	return r.ClosedFlows, nil
}

// Ports changes the sandbox's published ports (op supproto.OpPortAdd or
// OpPortRemove, with p) or lists them (OpPortList, p nil), and returns
// those served afterwards.
func (c *Client) Ports(ctx context.Context, op string, p *publish.Port) ([]publish.Binding, error) {
	r, err := c.oneShot(ctx, &supproto.Request{Op: op, Port: p})
	if err != nil {
		return nil, err
	}
	return r.Ports, nil
}

// Mount adds a mount (op supproto.OpMountAdd, volume in -v notation) to
// the running sandbox or removes the one at guest path guest
// (OpMountRemove), and returns the mounts served afterwards in -v
// notation.
func (c *Client) Mount(ctx context.Context, op, volume, guest string) ([]string, error) {
	r, err := c.oneShot(ctx, &supproto.Request{Op: op, Volume: volume, Path: guest})
	if err != nil {
		return nil, err
	}
	return r.Mounts, nil
}

// Approvals lists the questions the sandbox's gateways hold for the host
// user (see internal/approval).
func (c *Client) Approvals(ctx context.Context) ([]approval.Approval, error) {
	r, err := c.oneShot(ctx, &supproto.Request{Op: supproto.OpApprovals})
	if err != nil {
		return nil, err
	}
	return r.Approvals, nil
}

// Approve answers a held question; extra goes into the record.
func (c *Client) Approve(ctx context.Context, id, decision, by string, extra map[string]any) (*approval.Approval, error) {
	r, err := c.oneShot(ctx, &supproto.Request{Op: supproto.OpApprove, ID: id, Decision: decision, By: by, Extra: extra})
	if err != nil {
		return nil, err
	}
	if r.Approval == nil {
		return nil, fmt.Errorf("sandbox: approve %s: the supervisor returned no approval: %w", id, errdefs.ErrUnavailable)
	}
	return r.Approval, nil
}
