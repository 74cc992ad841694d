package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/vm/qmp"
)

const (
	// stderrTail is how much of QEMU's output is kept for error reports.
	stderrTail = 8 << 10
	// quitGrace is how long a QMP quit may take before QEMU is killed.
	quitGrace = 5 * time.Second
)

// Machine is a running QEMU process.
//
// Its lifetime is bound to the ctx given to Start: when ctx is done QEMU
// is asked to quit over QMP and killed if it does not. Wait, Done, PID and
// Stderr may be called from any goroutine; Close must be called once the
// Machine is no longer needed (it is idempotent).
type Machine struct {
	cmd     *exec.Cmd
	qmpPath string
	opPath  string // OperatorQMPSocket, removed with the machine
	log     *slog.Logger
	out     *tailBuffer

	done     chan struct{}
	waitErr  error           // set before done is closed
	stopping <-chan struct{} // the ctx given to Start is done

	mu      sync.Mutex // guards client, dialing and closed; never held while dialing
	client  *qmp.Client
	dialing chan struct{} // closed when the dial in progress ends; nil when none
	closed  bool          // Close ran: no new connection is kept

	closeOnce sync.Once

	// SaveBandwidth caps SaveState's writing, in bytes per second (0: no
	// cap). Set it before the first save.
	SaveBandwidth int64
}

// Start runs QEMU as described by cfg. It returns once the process has
// started; it does not wait for QMP or the guest. If QEMU rejects its
// command line it exits at once: Wait then returns an error naming QEMU's
// complaint, and QMP returns that error too.
func Start(ctx context.Context, cfg Config, logger *slog.Logger) (*Machine, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.QMPSocket == "" {
		return nil, invalid("no QMP socket path")
	}
	args, err := cfg.Args()
	if err != nil {
		return nil, err
	}
	qemu, err := cfg.qemuPath()
	if err != nil {
		return nil, err
	}
	for _, p := range []string{cfg.Kernel, cfg.Initrd} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("vm: start: %w: %w: run `smx setup`", errdefs.ErrNotFound, err)
		}
	}
	// A stale socket from a crashed run would let QMP dial too early and
	// get ECONNREFUSED until QEMU replaces it; remove it up front.
	for _, p := range []string{cfg.QMPSocket, cfg.OperatorQMPSocket} {
		if p == "" {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("vm: start: remove stale QMP socket: %w", err)
		}
	}

	m := &Machine{
		qmpPath:  cfg.QMPSocket,
		opPath:   cfg.OperatorQMPSocket,
		log:      logger,
		out:      &tailBuffer{max: stderrTail},
		done:     make(chan struct{}),
		stopping: ctx.Done(),
	}
	cmd := exec.CommandContext(ctx, qemu, args...)
	cmd.Stdout = m.out
	cmd.Stderr = m.out
	cmd.ExtraFiles = cfg.ExtraFiles
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// If the supervisor dies, so does its VM: nothing else would ever
		// stop it. (The signal fires when the forking OS thread exits;
		// the Go runtime does not retire threads that are not locked.)
		Pdeathsig: syscall.SIGKILL,
	}
	cmd.Cancel = func() error {
		// Only an existing connection is used: a dial could take as long
		// as QEMU takes to answer, and exec starts the WaitDelay timer
		// after Cancel returns.
		m.mu.Lock()
		c := m.client
		m.mu.Unlock()
		if c != nil {
			qctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := c.Execute(qctx, "quit", nil, nil); err == nil || errors.Is(err, errdefs.ErrUnavailable) {
				return nil
			}
		}
		return cmd.Process.Kill()
	}
	// After Cancel, WaitDelay is how long QEMU gets before SIGKILL; it also
	// bounds the wait for the output pipe if a child somehow kept it open.
	cmd.WaitDelay = quitGrace
	m.cmd = cmd

	logger.Debug("starting qemu", "cmd", qemu+" "+strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("vm: start %s: %w: %w", qemu, errdefs.ErrUnavailable, err)
	}
	go m.wait()
	return m, nil
}

func (m *Machine) wait() {
	err := m.cmd.Wait()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			// QEMU explains a failed start on its last line
			// ("qemu-system-x86_64: -foo: invalid option").
			if last := m.out.lastLine(); last != "" {
				err = fmt.Errorf("%w: %s", err, last)
			}
		}
		err = fmt.Errorf("vm: qemu: %w", err)
	}
	m.waitErr = err
	m.log.Debug("qemu exited", "pid", m.cmd.Process.Pid, "err", err)
	close(m.done)
}

// PID is QEMU's process id.
func (m *Machine) PID() int { return m.cmd.Process.Pid }

// Done is closed when QEMU has exited.
func (m *Machine) Done() <-chan struct{} { return m.done }

// Wait blocks until QEMU exits and returns how it ended: nil after a clean
// exit (guest poweroff, QMP quit). Every call returns the same result.
func (m *Machine) Wait() error {
	<-m.done
	return m.waitErr
}

// Stderr returns the last few KiB QEMU wrote to stdout and stderr.
func (m *Machine) Stderr() string { return m.out.String() }

// QMP returns the machine's QMP client, connecting on first use. QEMU
// creates the socket a moment after it starts, so QMP retries until the
// socket answers, ctx is done or QEMU exits. The client belongs to the
// Machine: do not Close it.
//
// One caller dials at a time, without holding the machine's mutex: the
// others wait for that dial (or for their own ctx), and ReleaseQMP,
// Close and a cancelled Start's QMP quit are never held up by it.
func (m *Machine) QMP(ctx context.Context) (*qmp.Client, error) {
	for {
		m.mu.Lock()
		if m.client != nil {
			select {
			case <-m.client.Done():
				m.client = nil // connection lost; dial again
			default:
				c := m.client
				m.mu.Unlock()
				return c, nil
			}
		}
		if m.closed {
			m.mu.Unlock()
			return nil, fmt.Errorf("vm: qmp: machine closed: %w", errdefs.ErrUnavailable)
		}
		if wait := m.dialing; wait != nil {
			m.mu.Unlock()
			select {
			case <-wait:
				continue // take its connection, or dial in turn
			case <-ctx.Done():
				return nil, fmt.Errorf("vm: qmp: %w: %w", errdefs.ErrUnavailable, ctx.Err())
			}
		}
		wait := make(chan struct{})
		m.dialing = wait
		m.mu.Unlock()
		c, err := m.dial(ctx)
		m.mu.Lock()
		m.dialing = nil
		close(wait)
		if err == nil && m.closed {
			c.Close()
			c, err = nil, fmt.Errorf("vm: qmp: machine closed: %w", errdefs.ErrUnavailable)
		}
		if err == nil {
			m.client = c
		}
		m.mu.Unlock()
		return c, err
	}
}

// dial connects to QMP, retrying until the socket answers, ctx is done
// or QEMU exits.
func (m *Machine) dial(ctx context.Context) (*qmp.Client, error) {
	// Often: a restore's first QMP command waits for QEMU's socket, and a
	// refused connect costs next to nothing.
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-m.done:
			return nil, fmt.Errorf("vm: qmp: qemu exited: %w: %w", errdefs.ErrUnavailable, m.waitErr)
		default:
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		c, err := qmp.Dial(dctx, m.qmpPath)
		cancel()
		if err == nil {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("vm: qmp: %w: %w (last: %v)", errdefs.ErrUnavailable, ctx.Err(), err)
		case <-m.stopping:
			return nil, fmt.Errorf("vm: qmp: machine is stopping: %w", errdefs.ErrUnavailable)
		case <-m.done:
		case <-tick.C:
		}
	}
}

// ReleaseQMP closes the machine's QMP connection, if any; the next QMP
// call dials again. QEMU serves one QMP client at a time, so a supervisor
// that keeps its connection after an operation locks out everyone else
// who attaches to the socket (a debugger, `socat`, a test's memory dump).
func (m *Machine) ReleaseQMP() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.client != nil {
		m.client.Close()
		m.client = nil
	}
}

func (m *Machine) quitQMP(ctx context.Context) error {
	c, err := m.QMP(ctx)
	if err != nil {
		return err
	}
	err = c.Execute(ctx, "quit", nil, nil)
	// QEMU may close the socket before its reply arrives; that is success.
	if err != nil && errors.Is(err, errdefs.ErrUnavailable) {
		return nil
	}
	return err
}

// Quit asks QEMU to exit over QMP, and kills it if it has not exited when
// ctx is done or after a short grace period. It returns nil once QEMU is
// gone, however it ended.
func (m *Machine) Quit(ctx context.Context) error {
	select {
	case <-m.done:
		return nil
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, quitGrace)
	defer cancel()
	if err := m.quitQMP(ctx); err != nil {
		m.log.Warn("qmp quit failed; killing qemu", "err", err)
		m.Kill()
	}
	select {
	case <-m.done:
	case <-ctx.Done():
		m.log.Warn("qemu did not quit in time; killing it", "pid", m.PID())
		m.Kill()
		<-m.done
	}
	return nil
}

// Kill sends SIGKILL to QEMU. It does not wait; use Wait or Done.
func (m *Machine) Kill() {
	if err := m.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		m.log.Warn("kill qemu", "pid", m.PID(), "err", err)
	}
}

// Close kills QEMU if it still runs (call Quit first for a clean stop),
// waits for it, closes the QMP connection and removes the QMP socket.
// It is idempotent.
func (m *Machine) Close() error {
	m.closeOnce.Do(func() {
		m.Kill()
		<-m.done
		m.mu.Lock()
		m.closed = true
		if m.client != nil {
			m.client.Close()
			m.client = nil
		}
		m.mu.Unlock()
		os.Remove(m.qmpPath)
		if m.opPath != "" {
			os.Remove(m.opPath)
		}
	})
	return nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

func (t *tailBuffer) lastLine() string {
	s := strings.TrimSpace(t.String())
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}
