package sandbox

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Start launches the sandbox's supervisor as a detached process (its own
// session, so a Ctrl-C at the CLI does not reach it) and waits until the
// guest agent answers or the boot fails. argv is the supervisor command,
// normally {smx, "__supervise", name}.
func (m *Manager) Start(ctx context.Context, name string, argv []string) (*Info, error) {
	return m.StartOwned(ctx, name, argv, nil)
}

// OwnerFD is the supervisor's file descriptor for the owner pipe, when it
// has an owner (SMX_OWNER_FD names it).
const OwnerFD = 4

// StartOwned is Start for a sandbox that belongs to the calling process
// (`smx run`): owner is the read end of a pipe whose write end only the
// caller holds, open for as long as it lives. When the caller dies in any
// way, SIGKILL included, the supervisor reads end of file and removes the
// sandbox. A nil owner is Start.
func (m *Manager) StartOwned(ctx context.Context, name string, argv []string, owner *os.File) (*Info, error) {
	if in, err := m.startable(name); err != nil {
		return in, err
	}
	p := m.Paths(name)
	logf, err := openSupervisorLog(p, name)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	cmd := m.supervisorCmd(argv, p.Dir, pw, owner)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, fmt.Errorf("sandbox %s: start supervisor: %w", name, err)
	}
	pw.Close()
	// Reap the supervisor if it exits while we are still alive; once we
	// exit, init adopts it.
	go cmd.Wait()
	return m.awaitReady(ctx, name, cmd, pr)
}

// supervisorCmd is the supervisor command argv, run in dir in a session of
// its own (a Ctrl-C at the CLI does not reach it), with the write end of
// its ready pipe on fd 3 and owner (StartOwned) on fd 4 (OwnerFD; closed
// when nil).
func (m *Manager) supervisorCmd(argv []string, dir string, ready, owner *os.File) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SMX_HOME="+m.State.Root)
	cmd.ExtraFiles = []*os.File{ready, owner}
	if owner != nil {
		cmd.Env = append(cmd.Env, fmt.Sprintf("SMX_OWNER_FD=%d", OwnerFD))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	return cmd
}

// startable returns sandbox name when no supervisor runs it, and otherwise
// (or when it does not exist) an error, with the sandbox when there is one.
func (m *Manager) startable(name string) (*Info, error) {
	in, err := m.Get(name)
	if err != nil {
		return nil, err
	}
	if SupervisorAlive(m.Paths(name)) {
		return in, fmt.Errorf("sandbox %s is already %s: %w", name, in.State.Status, errdefs.ErrExists)
	}
	return in, nil
}

// openSupervisorLog opens the sandbox's supervisor log for appending: the
// supervisor's stdout and stderr.
func openSupervisorLog(p Paths, name string) (*os.File, error) {
	f, err := os.OpenFile(p.Log(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", name, err)
	}
	return f, nil
}

// awaitReady waits for the supervisor cmd of sandbox name to say on its
// ready pipe (pr) that the guest answers, or why it did not.
func (m *Manager) awaitReady(ctx context.Context, name string, cmd *exec.Cmd, pr *os.File) (*Info, error) {
	p := m.Paths(name)
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(pr).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case l := <-line:
		if l == "ok" {
			return m.Get(name)
		}
		if l == "" {
			l = "supervisor exited without a word; see " + p.Log()
		}
		// The supervisor says why before it has cleaned up; let it finish,
		// so the caller (and an `rm` right after) sees it gone.
		for deadline := time.Now().Add(10 * time.Second); SupervisorAlive(p) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		in, _ := m.Get(name)
		return in, fmt.Errorf("sandbox %s failed to start: %s", name, l)
	case <-ctx.Done():
		cmd.Process.Signal(syscall.SIGTERM)
		return nil, ctx.Err()
	}
}

// ParkedFD is a parked supervisor's file descriptor for the name of the
// sandbox it is to run (SMX_PARKED_FD names it).
const ParkedFD = 5

// Parked is a supervisor process started before its sandbox exists, so
// that its start (a 27 MB Go binary, about 30 ms here) runs while the
// caller creates the sandbox (`smx run`); Start hands it the sandbox,
// Cancel lets it exit.
type Parked struct {
	m     *Manager
	cmd   *exec.Cmd
	name  *os.File // write end: the sandbox's name, one line
	ready *os.File // read end of the ready pipe
}

// Park starts the supervisor argv (without a sandbox name) detached, as
// StartOwned does, waiting for Parked.Start. owner is as for StartOwned.
func (m *Manager) Park(argv []string, owner *os.File) (*Parked, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	nr, nw, err := os.Pipe()
	if err != nil {
		pr.Close()
		pw.Close()
		return nil, err
	}
	defer pw.Close()
	defer nr.Close()
	cmd := m.supervisorCmd(argv, "/", pw, owner) // Unpark moves it into the sandbox's directory
	cmd.ExtraFiles = append(cmd.ExtraFiles, nr)  // fd 5 (ParkedFD)
	cmd.Env = append(cmd.Env, fmt.Sprintf("SMX_PARKED_FD=%d", ParkedFD))
	if err := cmd.Start(); err != nil {
		pr.Close()
		nw.Close()
		return nil, fmt.Errorf("start supervisor: %w", err)
	}
	go cmd.Wait()
	return &Parked{m: m, cmd: cmd, name: nw, ready: pr}, nil
}

// Start hands the parked supervisor the sandbox name (created, stopped or
// crashed: as StartOwned checks) and waits as StartOwned does.
func (pk *Parked) Start(ctx context.Context, name string) (*Info, error) {
	defer pk.ready.Close()
	if in, err := pk.m.startable(name); err != nil {
		pk.name.Close()
		return in, err
	}
	_, err := fmt.Fprintln(pk.name, name)
	pk.name.Close()
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: start supervisor: %w", name, err)
	}
	return pk.m.awaitReady(ctx, name, pk.cmd, pk.ready)
}

// Cancel lets a parked supervisor exit without a sandbox.
func (pk *Parked) Cancel() {
	pk.name.Close()
	pk.ready.Close()
}

// Unpark is the parked supervisor's side of Parked.Start: it reads the
// sandbox's name from ParkedFD, moves into the sandbox's directory and
// sends its own output (stdout, stderr) to the sandbox's supervisor log,
// as StartOwned sets them up. ok is false when the caller let it go.
func Unpark(m *Manager) (name string, ok bool, err error) {
	f := os.NewFile(ParkedFD, "parked")
	line, _ := bufio.NewReader(f).ReadString('\n')
	f.Close()
	if line == "" {
		return "", false, nil
	}
	name = strings.TrimSpace(line)
	if err := ValidName(name); err != nil {
		return "", false, err
	}
	p := m.Paths(name)
	if err := os.Chdir(p.Dir); err != nil {
		return "", false, fmt.Errorf("sandbox %s: %w", name, err)
	}
	logf, err := openSupervisorLog(p, name)
	if err != nil {
		return "", false, err
	}
	defer logf.Close()
	for _, fd := range []int{1, 2} {
		if err := unix.Dup3(int(logf.Fd()), fd, 0); err != nil {
			return "", false, fmt.Errorf("sandbox %s: supervisor log: %w", name, err)
		}
	}
	return name, true, nil
}

// Stop asks the supervisor to stop the sandbox within timeout. A sandbox
// that is not running is left as it is.
func (m *Manager) Stop(ctx context.Context, name string, timeout time.Duration) error {
	in, err := m.Get(name)
	if err != nil {
		return err
	}
	p := m.Paths(name)
	if !SupervisorAlive(p) {
		// A suspended sandbox is stopped by dropping its saved state.
		if _, err := os.Stat(p.SuspendState()); err == nil {
			os.Remove(p.SuspendState())
			os.Remove(p.SuspendHost())
			if _, err := Apply(in.State, EventStopped); err != nil {
				return nil // a stale saved state: the sandbox was not suspended
			}
			_, err = Change(p, in.State, EventStopped, func(st *State) { *st = State{Stopped: time.Now()} })
			if err != nil {
				return fmt.Errorf("sandbox %s: stop: %w", name, err)
			}
			return nil
		}
		return nil // stopped, created or crashed: nothing runs
	}
	c := &Client{Paths: p}
	ctx, cancel := context.WithTimeout(ctx, timeout+10*time.Second)
	defer cancel()
	err = c.Stop(ctx, timeout)
	// The supervisor answers just before it exits; wait for its lock so
	// the caller sees a settled state.
	for SupervisorAlive(p) {
		if ctx.Err() != nil {
			m.killSupervisor(name)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil && !errors.Is(err, errdefs.ErrFailed) {
		// The answer can be lost when the supervisor exits; what counts
		// is the state it left.
		if in, gerr := m.Get(name); gerr == nil && in.State.Status == StatusStopped {
			return nil
		}
		return fmt.Errorf("sandbox %s: stop: %w", name, err)
	}
	return nil
}

// killSupervisor is the last resort for a supervisor that does not answer.
// QEMU dies with it (it is started with a parent-death signal).
func (m *Manager) killSupervisor(name string) {
	in, err := m.Get(name)
	if err != nil || in.State.SupervisorPID <= 0 {
		return
	}
	syscall.Kill(in.State.SupervisorPID, syscall.SIGKILL)
	if in.State.QEMUPID > 0 {
		syscall.Kill(in.State.QEMUPID, syscall.SIGKILL)
	}
}
