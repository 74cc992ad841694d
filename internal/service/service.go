// Package service is smx's host service layer: every lifecycle operation
// on sandboxes, snapshots, images, profiles and logs, behind one API that
// the CLI, `smx serve` and the MCP server call. It owns the orchestration
// (what to check, lock, create, start, tell the supervisor and log, in
// which order) and enforces the sandbox state machine
// (sandbox.Check over the one transition table) before every operation;
// callers only turn flags or requests into request structs and print or
// serialise the results.
//
// Contract for every method:
//   - It takes a context.Context; cancelling it abandons the wait (an
//     exec's stream closes, which kills the process in the guest; a start
//     signals its supervisor) but never leaves half-made state behind.
//   - Errors are classed with internal/errdefs (errors.Is works, also for
//     errors that crossed the supervisor's socket), and their text is one
//     sentence a user can act on.
//   - Results are plain JSON-tagged structs, safe to serialise.
//   - A Service holds no per-sandbox state in memory: the state directory
//     and the supervisors are the truth, so any number of Services (in
//     one process or in several CLIs at once) may act concurrently; file
//     locks in the state directory serialise what must be serialised.
//     A Service is safe for concurrent use.
package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/image"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
)

// Service carries out lifecycle operations on one state directory.
type Service struct {
	state statedir.Dir
	log   *slog.Logger

	// Supervisor is the command that runs a sandbox's supervisor, before
	// its arguments ("__supervise NAME [--cold]"); default: this
	// executable. Set it before the first call.
	Supervisor []string
	// Warn, when set, is told about things that went wrong after an
	// operation had already happened (a log record that could not be
	// written); the operation still succeeds.
	Warn func(msg string)
}

// New returns the service for state directory state. log receives debug
// detail (nil discards it).
func New(state statedir.Dir, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Service{state: state, log: log}
}

// State is the state directory the service works on.
func (s *Service) State() statedir.Dir { return s.state }

func (s *Service) manager() *sandbox.Manager  { return &sandbox.Manager{State: s.state} }
func (s *Service) images() *image.Store       { return &image.Store{Dir: s.state.Images()} }
func (s *Service) snapshots() *snapshot.Store { return &snapshot.Store{Dir: s.state.Snapshots()} }
func (s *Service) templates() *snapshot.Store { return &snapshot.Store{Dir: s.state.Templates()} }
func (s *Service) client(name string) *sandbox.Client {
	return &sandbox.Client{Paths: s.manager().Paths(name)}
}

func (s *Service) warn(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.log.Warn(msg)
	if s.Warn != nil {
		s.Warn(msg)
	}
}

// check reads sandbox name and checks op against the state table.
func (s *Service) check(name string, op sandbox.Op) (*sandbox.Info, sandbox.Transition, error) {
	in, err := s.manager().Get(name)
	if err != nil {
		return nil, sandbox.Transition{}, err
	}
	t, err := sandbox.Check(in, op)
	return in, t, err
}

// logEvent appends a record to a sandbox's log. While a supervisor runs
// it owns the log (single writer) and records its own events; the service
// writes only when none does (create, remove, a profile change on a
// sandbox that is not running). Failures are warned about, not returned:
// the operation itself already happened.
func (s *Service) logEvent(ctx context.Context, name, kind string, fields map[string]any) {
	if err := s.state.Ensure(); err != nil {
		return
	}
	key, err := audit.LoadOrCreatePinnedKey(s.state.Audit())
	if err == nil {
		var l *audit.Log
		if l, err = audit.Open(audit.Dir(s.state.Logs(), name), name, key.Signer()); err == nil {
			_, err = l.Append(context.WithoutCancel(ctx), kind, fields)
			if cerr := l.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		s.warn("log %s for %s: %v", kind, name, err)
	}
}

func (s *Service) supervisorArgv(name string, cold, logCreate bool) ([]string, error) {
	argv := append([]string(nil), s.Supervisor...)
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		argv = []string{exe}
	}
	argv = append(argv, "__supervise")
	if name != "" { // a parked supervisor reads it later (sandbox.Park)
		argv = append(argv, name)
	}
	if cold {
		argv = append(argv, "--cold")
	}
	if logCreate {
		argv = append(argv, "--log-create")
	}
	return argv, nil
}
