// The supervisor's life: Run (lock, boot, serve, wait for the end) and
// the ways it ends (stop, finish), each claimed once.

package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/vm"
)

// Run boots the sandbox and serves it until it stops or ctx is cancelled
// (SIGTERM), which stops it gracefully. It returns nil on a requested stop.
func Run(ctx context.Context, opts Options) (err error) {
	if opts.BootTimeout == 0 {
		opts.BootTimeout = 120 * time.Second
	}
	s := &Supervisor{
		opts:     opts,
		log:      opts.Logger,
		paths:    (&sandbox.Manager{State: opts.State}).Paths(opts.Name),
		stopping: make(chan struct{}),
		stopDone: make(chan struct{}),
		logOpen:  make(chan struct{}),
		tracing:  os.Getenv("SMX_TRACE") == "1",
	}
	s.trace("run")
	if p := os.Getenv("SMX_CPUPROFILE"); p != "" {
		if stop := cpuProfile(strings.ReplaceAll(p, "{name}", opts.Name), s.log); stop != nil {
			defer stop()
		}
	}
	vm.MeasureTSC() // a boot's Config.Args needs it under TCG (a restore's does not); it takes 20 ms
	s.bgCtx, s.cancelBg = context.WithCancel(context.Background())
	defer s.cancelBg()
	ready := opts.Ready
	ownerGone := s.watchOwner()
	defer func() {
		if ready != nil {
			fmt.Fprintf(ready, "%v\n", firstLine(err))
			ready.Close()
		}
		s.slimming.Wait()
		var tomb string
		if s.discarded {
			tomb = s.retire()
		}
		if cerr := s.close(); err == nil {
			err = cerr
		}
		if tomb != "" {
			os.RemoveAll(tomb)
		}
		// A boot that failed after the owner died has nobody else to
		// remove its sandbox.
		if !s.discarded && err != nil && isDone(ownerGone) {
			s.removeSelf()
		}
	}()

	lock, err := statedir.TryLockFor(s.paths.Lock(), 2*time.Second)
	if errors.Is(err, statedir.ErrLocked) {
		return fmt.Errorf("supervisor: sandbox %s is already running: %w", opts.Name, errdefs.ErrExists)
	}
	if err != nil {
		return err
	}
	s.defer_(lock.Unlock)
	// Which directory this sandbox is, so a removal never takes a new
	// sandbox that took the name.
	s.ownedDir, _ = os.Stat(s.paths.Dir)
	if s.spec, err = sandbox.ReadSpec(s.paths); err != nil {
		return fmt.Errorf("supervisor: sandbox %s: %w", opts.Name, err)
	}
	s.self = s.spec.LogIdentity()
	if s.state, err = sandbox.LockedState(s.paths); err != nil {
		return fmt.Errorf("supervisor: sandbox %s: %w", opts.Name, err)
	}
	s.trace("locked")
	// The log opens (reads the log back, appends log.open, fsyncs) while
	// the machine starts: every record waits for it (audit), and the
	// sandbox is not reported running unless it opened.
	spec := s.spec // the boot changes s.spec meanwhile
	go func() {
		defer close(s.logOpen)
		defer s.trace("log open")
		if s.logErr = s.openLog(); s.logErr != nil || !opts.LogCreate {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		// Like every record of this process, but a sandbox whose log
		// lacks its creation is not started.
		if _, err := s.log_.Append(ctx, audit.KindSandboxCreate, spec.CreateFields()); err != nil {
			s.logErr = fmt.Errorf("supervisor: log: %w", err)
		}
	}()
	s.defer_(func() error {
		if <-s.logOpen; s.log_ != nil {
			return s.log_.Close()
		}
		return nil
	})
	if err := s.planRestore(); err != nil {
		return err
	}
	if err := s.publishPorts(); err != nil {
		return err
	}
	// Written once QEMU runs (boot), while it starts: until then the
	// sandbox reads as it was, and a supervisor that dies before leaves it so.
	if err := s.noteEvent(sandbox.EventLaunched, func(st *sandbox.State) {
		*st = sandbox.State{SupervisorPID: os.Getpid(), Started: time.Now()}
	}); err != nil {
		return fmt.Errorf("supervisor: sandbox %s: %w", opts.Name, err)
	}

	if err := s.boot(ctx); err != nil {
		s.audit(audit.KindSandboxCrash, map[string]any{"phase": "boot", "error": err.Error()})
		werr := s.apply(sandbox.EventCrashed, func(st *sandbox.State) {
			st.Error = err.Error()
			st.ConsoleTail = sandbox.ConsoleTail(s.paths.Console(), 20)
			st.Stopped = time.Now()
		})
		return errors.Join(err, werr)
	}
	if <-s.logOpen; s.logErr != nil {
		return s.logErr
	}
	if err := s.listen(); err != nil {
		return err
	}
	s.stateMu.Lock()
	startFields := map[string]any{
		"accel": s.state.Accel, "kernel": s.state.Kernel, "boot_ms": s.state.BootMS,
		"image": s.spec.Image, "profile": s.spec.Profile, "profile_hash": s.spec.ProfileHash,
		"qemu_pid": s.state.QEMUPID, "supervisor_pid": os.Getpid(),
	}
	s.stateMu.Unlock()
	if s.restore != nil {
		startFields["restored_from"] = s.restore.label
		s.restored()
	}
	// Both durable before the caller hears of it; written at once, their
	// fsyncs share a journal commit.
	// A start whose running state cannot be written fails.
	var running sync.WaitGroup
	var bootedErr error
	running.Go(func() { bootedErr = s.apply(sandbox.EventBooted, nil) })
	s.audit(audit.KindSandboxStart, startFields)
	running.Wait()
	if bootedErr != nil {
		if isDone(s.stopping) {
			// A stop came in between (the table refused booted after
			// stopping): it ends the machine; the start did not happen.
			<-s.stopDone
			s.drain()
			return fmt.Errorf("supervisor: sandbox %s was stopped while it started: %w", opts.Name, errdefs.ErrFailed)
		}
		return bootedErr
	}
	fmt.Fprintln(ready, "ok")
	s.trace("ready")
	ready.Close()
	ready = nil
	s.log.Info("running", "boot", time.Since(s.state.Started))

	go s.serve()
	if err := s.makeReserve(); err != nil {
		s.log.Warn("no reserve for a full disk", "err", err)
	}
	go s.watchBlocks()
	go s.watchLimits()
	select {
	case <-ownerGone:
		s.log.Info("the CLI that owns this sandbox is gone; removing it")
		s.discard("the smx run that owned it exited without removing it")
		<-s.stopDone
		s.drain()
		return s.stopErr
	case <-ctx.Done():
		s.log.Info("signalled; stopping")
		s.stop(15 * time.Second)
		<-s.stopDone
		s.drain()
		return s.stopErr // nil, unless a state could not be written
	case <-s.stopping:
		<-s.stopDone
		s.drain()
		return s.stopErr
	case <-s.machine.Done():
		// Whoever ends the machine on purpose (stop, suspend, snapshot
		// --stop) claims the ending before it acts; if nobody has, the
		// machine died unasked, and claiming the ending here makes a
		// stop that comes later wait for the crash to be recorded.
		var crash error
		if !s.finish("", func() {
			werr := s.machine.Wait()
			msg := fmt.Sprintf("QEMU exited unexpectedly (%v)", werr)
			if tail := strings.TrimSpace(s.machine.Stderr()); tail != "" {
				msg += ": " + lastLine(tail)
			}
			s.log.Error(msg)
			s.audit(audit.KindSandboxCrash, map[string]any{"phase": "running", "error": msg})
			serr := s.apply(sandbox.EventCrashed, func(st *sandbox.State) {
				st.Error = msg
				st.ConsoleTail = sandbox.ConsoleTail(s.paths.Console(), 20)
				st.Stopped = time.Now()
				st.QEMUPID = 0
			})
			crash = errors.Join(errors.New(msg), serr)
			s.stopErr = errors.Join(fmt.Errorf("sandbox %s crashed: %s: %w", s.spec.Name, msg, errdefs.ErrFailed), serr)
		}) {
			<-s.stopDone
			s.drain()
			return s.stopErr
		}
		<-s.stopDone
		s.drain()
		return crash
	}
}

// drain lets in-flight requests finish (above all the stop request, whose
// caller waits for its answer) before the process exits.
func (s *Supervisor) drain() {
	s.endSessions() // the guest is gone: end relayed streams now
	s.cancelBg()
	done := make(chan struct{})
	go func() { s.handlers.Wait(); s.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		s.log.Warn("requests still in flight at exit")
	}
}

// promoteTimeout bounds the copy of what the guest wrote over its
// read-only caches at a stop (a few hundred MB under TCG).
const promoteTimeout = 2 * time.Minute

// stop powers the guest off, then quits QEMU, then kills it, within
// timeout. Only the first call acts; all callers wait on stopDone.
func (s *Supervisor) stop(timeout time.Duration) {
	s.shutdown(func() {
		{
			deadline := time.Now().Add(timeout)
			// A save in progress is abandoned rather than waited for.
			s.cancelBg()
			s.opMu.Lock()
			if s.paused() {
				// A paused guest cannot power itself off.
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				s.machine.Cont(cctx)
				cancel()
			}
			s.opMu.Unlock()
			// Read-only caches take what the host verifies of what the
			// guest wrote over them, while the guest still runs; on a
			// budget of its own, since the poweroff's may be short.
			pctx, pcancel := context.WithTimeout(context.Background(), promoteTimeout)
			s.promoteCaches(pctx)
			pcancel()
			// Guest first: it syncs its disk.
			ctx, cancel := context.WithTimeout(context.Background(), timeout/2)
			_, err := s.call(ctx, &agentproto.Request{Op: agentproto.OpPowerOff})
			if err != nil {
				s.log.Warn("guest poweroff", "err", err)
			}
			select {
			case <-s.machine.Done():
			case <-ctx.Done():
			}
			cancel()
			if !isDone(s.machine.Done()) {
				qctx, cancel := context.WithDeadline(context.Background(), deadline)
				s.log.Warn("guest did not power off; quitting QEMU")
				if err := s.machine.Quit(qctx); err != nil {
					s.log.Warn("quit", "err", err)
				}
				cancel()
			}
			if !isDone(s.machine.Done()) {
				s.machine.Kill()
				<-s.machine.Done()
			}
			s.audit(audit.KindSandboxStop, map[string]any{"timeout_ms": timeout.Milliseconds()})
			if err := s.apply(sandbox.EventStopped, func(st *sandbox.State) {
				st.Stopped = time.Now()
				st.QEMUPID = 0
				st.SupervisorPID = 0
			}); err != nil {
				s.stopErr = errors.Join(s.stopErr, err)
			}
		}
	})
}

// shutdown runs body, which ends the machine, as the one way this
// supervisor ends; only the first call acts and reports true. Everyone
// waits on stopDone.
func (s *Supervisor) shutdown(body func()) bool { return s.finish(sandbox.EventStopping, body) }

// finish claims the end of this supervisor's machine for body: only the
// first call (a stop, a suspend, a snapshot --stop, a discard, or the
// machine found dead) runs its body; ev, when set, is the event that
// moves the state meanwhile (stopping, discarded), written before finish
// returns. When it cannot be written, the machine is ended all the same
// and the error is in viaErr and stopErr.
func (s *Supervisor) finish(ev sandbox.Event, body func()) bool {
	first := false
	s.stopOnce.Do(func() {
		first = true
		close(s.stopping)
		if ev != "" {
			if err := s.apply(ev, nil); err != nil {
				s.viaErr, s.stopErr = err, err
			}
		}
		go func() {
			defer close(s.stopDone)
			body()
		}()
	})
	return first
}

// background runs f (a guest sync) in a goroutine the supervisor waits
// for before it exits; f's ctx ends when the supervisor stops.
func (s *Supervisor) background(f func(ctx context.Context)) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		f(s.bgCtx)
	}()
}
