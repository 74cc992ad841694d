package supervisor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/vm"
)

// MainOptions are what the hidden `smx __supervise [NAME]` command parsed
// from its arguments.
type MainOptions struct {
	State statedir.Dir
	// Name is the sandbox to run; empty for a parked supervisor, which
	// learns it from its parent (sandbox.Parked.Start).
	Name string
	// Cold and LogCreate are as in Options.
	Cold, LogCreate bool
}

// Main is the supervisor process from its first instruction: the other
// half of sandbox.Manager's supervisorCmd (internal/sandbox/lifecycle.go),
// which starts this process detached with
//
//	fd 3                 the ready pipe: "ok" or one line of error (Options.Ready)
//	fd 4, SMX_OWNER_FD   the owner pipe of a sandbox one CLI owns (sandbox.OwnerFD)
//	fd 5, SMX_PARKED_FD  a parked supervisor's sandbox name (sandbox.ParkedFD)
//	SMX_BOOT_TIMEOUT     how long the guest agent may take to answer (default 2 minutes)
//
// Main takes those over, waits to be unparked when it was started without
// a name, and runs the sandbox until it stops or ctx is done (SIGTERM and
// SIGINT end it as well). Any failure before Run is also written to the
// ready pipe, so the starting CLI reads why rather than "exited without a
// word".
func Main(ctx context.Context, o MainOptions) error {
	ready := os.NewFile(3, "ready")
	fail := func(err error) error {
		if ready != nil {
			fmt.Fprintln(ready, err)
		}
		return err
	}
	name := o.Name
	if name == "" {
		if os.Getenv("SMX_PARKED_FD") != strconv.Itoa(sandbox.ParkedFD) {
			return fmt.Errorf("__supervise: no sandbox named: %w", errdefs.ErrInvalid)
		}
		// Started before its sandbox existed (smx run): it is told which
		// one once it does, or nothing (then it just exits).
		os.Unsetenv("SMX_PARKED_FD")
		// The host TSC's measurement (20 ms, which a booting machine's
		// arguments wait for under TCG) runs while the sandbox is
		// created, instead of after.
		vm.MeasureTSC()
		n, ok, err := sandbox.Unpark(&sandbox.Manager{State: o.State})
		if err != nil {
			return fail(err)
		}
		if !ok {
			return nil
		}
		name = n
	}
	agent, err := AgentPath()
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
	boot, err := bootTimeout()
	if err != nil {
		return fail(err)
	}
	opts := Options{
		State: o.State, Name: name, AgentPath: agent, Logger: NewLogger(os.Stderr), Ready: ready,
		BootTimeout: boot, Cold: o.Cold, LogCreate: o.LogCreate,
	}
	if os.Getenv("SMX_OWNER_FD") == strconv.Itoa(sandbox.OwnerFD) {
		os.Unsetenv("SMX_OWNER_FD")
		syscall.CloseOnExec(sandbox.OwnerFD)
		opts.Owner = os.NewFile(sandbox.OwnerFD, "owner")
	}
	return Run(ctx, opts)
}

// bootTimeout is SMX_BOOT_TIMEOUT, or 0 (Run's default) when unset.
func bootTimeout() (time.Duration, error) {
	v := os.Getenv("SMX_BOOT_TIMEOUT")
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("SMX_BOOT_TIMEOUT: %w", err)
	}
	return d, nil
}

// NewLogger is the supervisor's logger: text lines at info level, on w
// (its stderr, which sandbox.Manager points at the sandbox's supervisor
// log).
func NewLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
