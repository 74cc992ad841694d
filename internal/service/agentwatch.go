package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
)

// spawnAgentWatch starts the host process that waits for the agent's end
// (`smx __agent-wait NAME`, which calls WaitAgent): detached, in its own
// session, so it outlives the caller as the supervisor does. It ends when
// the agent does or when the sandbox stops or goes away.
func (s *Service) spawnAgentWatch(name string) error {
	argv := append([]string(nil), s.Supervisor...)
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		argv = []string{exe}
	}
	argv = append(argv, "__agent-wait", name)
	dir := s.manager().Paths(name).Dir
	logf, err := os.OpenFile(filepath.Join(dir, "agent-wait.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SMX_HOME="+s.state.Root)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("sandbox %s: start the agent's watcher: %w", name, err)
	}
	// Reap it if it ends while we live; once we exit, init adopts it.
	go cmd.Wait()
	return nil
}

// agentWaiter is the guest command whose exit status is the agent's: it
// waits for the wrapper's status file. It is labelled "agent-wait": the
// log records it as the sandbox's main command (run.start, then run.end
// with the agent's exit_code), and --idle-stop does not count it as
// activity; its arguments name the agent's command line.
func agentWaiter(rec *AgentRecord) []string {
	script := `while [ ! -e ` + agentExitFile + ` ]; do sleep 1; done; exit "$(cat ` + agentExitFile + `)"`
	return append([]string{"/bin/sh", "-c", script, "agent"}, rec.Command...)
}

// WaitAgent is the watcher's work (`smx __agent-wait NAME`): it waits for
// the agent in sandbox name to exit, records its status, stops the
// sandbox and, when the agent was run with Remove, deletes it. A sandbox
// that stops, is suspended or goes away first ends the wait; with Remove
// the stopped sandbox is still deleted (as `docker stop` does to a --rm
// container). A snapshot or a pause does not end it.
func (s *Service) WaitAgent(ctx context.Context, name string) error {
	rec, err := s.AgentRecord(name)
	if err != nil {
		return err
	}
	var st *ExitStatus
	for {
		st, err = s.Exec(ctx, ExecRequest{Name: name, Args: agentWaiter(rec), Label: "agent-wait"}, ExecIO{})
		if err == nil && st.Signal == 0 {
			break
		}
		if _, ok := CommandExitCode(err); ok {
			return err // no shell in the guest: nothing to wait with
		}
		// While the sandbox lives, a cut wait is started again: the
		// stream is only as durable as the control session (a snapshot
		// keeps it today, measured: one run.start across a snapshot
		// in TestAgentExit), and a paused sandbox refuses new execs.
		if in, gerr := s.manager().Get(name); gerr == nil && ctx.Err() == nil {
			switch in.State.Status {
			case sandbox.StatusRunning, sandbox.StatusPaused, sandbox.StatusBlocked:
				time.Sleep(time.Second)
				continue
			}
		}
		// The sandbox went down under the wait (stopped, suspended,
		// removed, crashed): the agent's end is not known.
		if rec.Remove {
			s.removeWhenDown(ctx, name)
		}
		return err
	}
	code, now := st.Code, time.Now().UTC()
	rec.ExitCode, rec.Exited = &code, &now
	if err := s.writeAgentRecord(name, rec); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.warn("sandbox %s: record the agent's exit status: %v", name, err)
	}
	return s.EndAgent(ctx, name, rec.Remove)
}

// EndAgent does what follows an agent's end, like a container whose
// command exited: sandbox name stops and is kept, or removed when remove
// (--rm). The watcher and an attached `smx agent run` both call it;
// whichever comes first does the work, and a sandbox already gone is no
// error.
func (s *Service) EndAgent(ctx context.Context, name string, remove bool) error {
	_, err := s.Stop(ctx, StopRequest{Name: name, Timeout: 10 * time.Second})
	if errors.Is(err, errdefs.ErrNotFound) {
		err = nil
	}
	if !remove {
		return err
	}
	// A stop that failed still leaves a forced removal to do.
	if err := s.Remove(ctx, RemoveRequest{Name: name, Force: true}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	return nil
}

// removeWhenDown deletes sandbox name once it is no longer live (a stop
// in progress finishes first); it gives up after a minute or when the
// sandbox is started again.
func (s *Service) removeWhenDown(ctx context.Context, name string) {
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		in, err := s.manager().Get(name)
		if err != nil {
			return
		}
		switch in.State.Status {
		case sandbox.StatusStopped, sandbox.StatusCrashed, sandbox.StatusCreated:
			s.Remove(ctx, RemoveRequest{Name: name})
			return
		}
	}
}

// AgentExit is the exit status of the agent in sandbox name once it has
// ended: from the guest's status file while the sandbox runs, else from
// the record or the log's run.end (which stays after the sandbox is
// removed). It waits up to wait for the status to be known.
func (s *Service) AgentExit(ctx context.Context, name string, wait time.Duration) (int, bool) {
	since := time.Time{}
	for end := time.Now().Add(wait); ; {
		var out bytes.Buffer
		if st, err := s.Exec(ctx, ExecRequest{Name: name, Args: []string{"cat", agentExitFile}}, ExecIO{Stdout: &out, Stderr: io.Discard}); err == nil && st.Code == 0 {
			if n, err := strconv.Atoi(strings.TrimSpace(out.String())); err == nil {
				return n, true
			}
		}
		if rec, err := s.AgentRecord(name); err == nil && rec.ExitCode != nil {
			return *rec.ExitCode, true
		}
		if in, err := s.manager().Get(name); err == nil {
			since = in.Spec.Created
		}
		if code, ok := s.loggedAgentExit(name, since); ok {
			return code, true
		}
		if time.Now().After(end) || ctx.Err() != nil {
			return 0, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// loggedAgentExit is the exit_code of the last run.end in sandbox name's
// log at or after since.
func (s *Service) loggedAgentExit(name string, since time.Time) (int, bool) {
	code, ok := 0, false
	audit.Scan(audit.Dir(s.state.Logs(), name), audit.Filter{Since: since}, func(r audit.Record) error {
		switch r.Kind {
		case audit.KindSandboxCreate:
			ok = false
		case audit.KindRunEnd:
			switch n := r.Fields["exit_code"].(type) {
			case float64:
				code, ok = int(n), true
			case json.Number:
				if i, err := n.Int64(); err == nil {
					code, ok = int(i), true
				}
			}
		}
		return nil
	})
	return code, ok
}
