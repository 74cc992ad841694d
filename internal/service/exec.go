package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/supproto"
	"github.com/smx-dev/smx/internal/tarfs"
)

// WindowSize is a terminal size.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// ExecRequest describes a command to run in a running sandbox.
type ExecRequest struct {
	Name string   `json:"name"`
	Args []string `json:"args"`
	// Env entries KEY=VALUE, added to the sandbox's own environment.
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`  // working directory; default the user's home or /
	User string   `json:"user,omitempty"` // name or uid[:gid]; default root
	// TTY runs the command on a pseudo-terminal: Stdout carries the
	// terminal's output and Stderr is unused. Size is its first size.
	TTY  bool        `json:"tty,omitempty"`
	Size *WindowSize `json:"size,omitempty"`
	// Label is how the log records it: "run" for the command of
	// `smx run`, "" for an exec; "agent", "attach" and "agent-wait" (logged
	// as "run") are an agent's own, which --idle-stop does not count.
	Label string `json:"label,omitempty"`
	// Root runs the command chrooted to this guest directory, and
	// Rlimits are set on it once started (a pod's container, see
	// internal/shim).
	Root    string              `json:"root,omitempty"`
	Rlimits []agentproto.Rlimit `json:"rlimits,omitempty"`
}

// ExecIO wires a command's streams and controls. Everything may be nil:
// no Stdin means the command reads /dev/null; nil writers discard.
type ExecIO struct {
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// Resize carries new terminal sizes (TTY only); Signal carries signal
	// numbers for the command's process group. Neither needs closing.
	Resize <-chan WindowSize
	Signal <-chan int
	// Started, if set, is called with the command's guest PID.
	Started func(pid int)
}

// ExitStatus is how a command ended. Signal is non-zero when a signal
// killed it; Code is then 128+Signal, as a shell reports it.
type ExitStatus struct {
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
}

// Exec runs a command in a running sandbox (any other status fails with
// errdefs.ErrFailed, saying what to do) and returns how it ended, once
// all its output has been written. Its start and end are logged by the
// supervisor. Cancelling ctx closes the stream, which kills the command
// in the guest. Any number of Execs may run at once on one sandbox.
// Writes to Stdout and Stderr come from one goroutine, in order.
//
// The goroutine copying Stdin ends when Stdin reports EOF or an error,
// or, after Exec returned, at its next Read; pass a Stdin whose Read can
// be interrupted (a pipe, a connection) when that matters.
//
// A command that could not be started (not found, not executable) fails
// with an error for which CommandExitCode gives 127 or 126.
func (s *Service) Exec(ctx context.Context, req ExecRequest, sio ExecIO) (*ExitStatus, error) {
	if len(req.Args) == 0 {
		return nil, fmt.Errorf("no command given: put it after --, e.g. `-- sh -c 'echo hi'`: %w", errdefs.ErrInvalid)
	}
	env, err := ParseEnv(req.Env)
	if err != nil {
		return nil, err
	}
	if _, _, err := s.check(req.Name, sandbox.OpExec); err != nil {
		return nil, err
	}
	areq := supproto.ExecRequest{Args: req.Args, Env: env, Dir: req.Dir, User: req.User, TTY: req.TTY,
		Root: req.Root, Rlimits: req.Rlimits}
	if req.Size != nil {
		areq.Size = &agentproto.WindowSize{Rows: req.Size.Rows, Cols: req.Size.Cols}
	}
	cio := sandbox.ExecIO{Stdin: sio.Stdin, Stdout: sio.Stdout, Stderr: sio.Stderr, Signal: sio.Signal, Started: sio.Started}
	done := make(chan struct{})
	defer close(done)
	if sio.Resize != nil {
		resize := make(chan agentproto.WindowSize)
		cio.Resize = resize
		go func() {
			for {
				select {
				case <-done:
					return
				case sz := <-sio.Resize:
					select {
					case resize <- agentproto.WindowSize{Rows: sz.Rows, Cols: sz.Cols}:
					case <-done:
						return
					}
				}
			}
		}()
	}
	st, err := s.client(req.Name).ExecLabeled(ctx, areq, cio, req.Label)
	if err != nil {
		return nil, err
	}
	return &ExitStatus{Code: st.Code, Signal: st.Signal}, nil
}

// CommandExitCode is the exit status a shell gives a command that Exec
// could not start: 127 not found, 126 not executable; ok is false for any
// other error.
func CommandExitCode(err error) (code int, ok bool) {
	code, _, ok = CommandStartError(err)
	return code, ok
}

// CommandStartError is CommandExitCode with the guest's reason the
// command did not start.
func CommandStartError(err error) (code int, reason string, ok bool) {
	var pe *agentproto.Error
	if errors.As(err, &pe) && pe.ExitCode != 0 {
		return pe.ExitCode, pe.Message, true
	}
	return 0, "", false
}

// CopyIn extracts a tar stream into directory dir of a running sandbox
// (modes kept, paths confined to the guest's filesystem) and returns the
// bytes written. The guest may refuse before the stream ends (a bad
// path): CopyIn then returns its error without reading the rest.
func (s *Service) CopyIn(ctx context.Context, name, dir string, tarStream io.Reader) (int64, error) {
	if _, _, err := s.check(name, sandbox.OpExec); err != nil {
		return 0, err
	}
	if !strings.HasPrefix(dir, "/") {
		return 0, fmt.Errorf("guest path %q must be absolute: %w", dir, errdefs.ErrInvalid)
	}
	return s.client(name).CopyIn(ctx, dir, tarStream)
}

// CopyOut writes a tar stream of path in a running sandbox to w; the
// archive's top entry is path's base name. The guest's stream passes
// tarfs.Check on its way: whoever extracts it (an API client, `tar x`)
// gets only entries under that name, no devices, no set-id bits, within
// tarfs's default limits. A stream that breaks a rule ends early with the
// refusal, which is a copy.refused record.
func (s *Service) CopyOut(ctx context.Context, name, path string, w io.Writer) error {
	if _, _, err := s.check(name, sandbox.OpExec); err != nil {
		return err
	}
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("guest path %q must be absolute: %w", path, errdefs.ErrInvalid)
	}
	c := s.client(name)
	_, err := tarfs.Forward(w, path, tarfs.Options{}, func(pw io.Writer) error {
		return c.CopyOut(ctx, path, pw)
	})
	s.logRefusal(c, path, err)
	return err
}

// logRefusal has the supervisor log a copy out the host refused.
func (s *Service) logRefusal(c *sandbox.Client, path string, err error) {
	if !errors.Is(err, errdefs.ErrDenied) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if lerr := c.CopyRefused(ctx, path, strings.TrimPrefix(err.Error(), "tarfs: ")); lerr != nil {
		s.warn("the refused copy of %s could not be logged: %v", path, lerr)
	}
}

// CopyToGuest copies host file or directory src into a running sandbox,
// docker cp's way: dst ending in "/" copies into that directory, else to
// dst itself.
func (s *Service) CopyToGuest(ctx context.Context, name, src, dst string) error {
	if _, _, err := s.check(name, sandbox.OpExec); err != nil {
		return err
	}
	if !strings.HasPrefix(dst, "/") {
		return fmt.Errorf("guest path %q must be absolute: %w", dst, errdefs.ErrInvalid)
	}
	if _, err := os.Lstat(src); err != nil {
		return fmt.Errorf("cp: %w", err)
	}
	entry := filepath.Base(filepath.Clean(src))
	dir := dst
	if !strings.HasSuffix(dst, "/") {
		dir, entry = filepath.Dir(dst), filepath.Base(dst)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarfs.Pack(pw, src, entry)) }()
	_, err := s.client(name).CopyIn(ctx, dir, pr)
	pr.Close()
	return err
}

// CopyFromGuest copies path src of a running sandbox to the host: into
// dst when dst is a directory, else to dst itself (its directory must
// exist), and returns the bytes of file content written. The guest's
// answer is hostile input: tarfs.Receive names the result on the host and
// refuses the whole copy, leaving nothing, when the stream holds anything
// else or goes past lim (zero fields: tarfs's defaults); the refusal is a
// copy.refused record in the sandbox's log. Files extracted as root keep
// their owners.
func (s *Service) CopyFromGuest(ctx context.Context, name, src, dst string, lim tarfs.Limits) (int64, error) {
	if _, _, err := s.check(name, sandbox.OpExec); err != nil {
		return 0, err
	}
	if !strings.HasPrefix(src, "/") {
		return 0, fmt.Errorf("guest path %q must be absolute: %w", src, errdefs.ErrInvalid)
	}
	c := s.client(name)
	n, err := tarfs.Receive(dst, src, tarfs.Options{Chown: os.Geteuid() == 0, Limits: lim}, func(w io.Writer) error {
		return c.CopyOut(ctx, src, w)
	})
	s.logRefusal(c, src, err)
	return n, err
}

// CheckExec returns nil when a command may run in sandbox name now, else
// the state table's refusal (so a caller refuses before it sets a
// terminal up).
func (s *Service) CheckExec(ctx context.Context, name string) error {
	_, _, err := s.check(name, sandbox.OpExec)
	return err
}

// DefaultCopyMaxBytes is the largest total of file content a copy out of
// a sandbox writes unless the caller says otherwise.
const DefaultCopyMaxBytes = tarfs.DefaultMaxBytes

// CopyLimit is the limits of a copy out of a sandbox that may write at
// most maxBytes of file content (the other limits: tarfs's defaults).
func CopyLimit(maxBytes int64) tarfs.Limits { return tarfs.Limits{Bytes: maxBytes} }
