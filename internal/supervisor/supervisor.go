// Package supervisor runs one sandbox: it boots QEMU, holds the control
// channel to the guest agent, serves the sandbox's API socket, and records
// the truth about the sandbox in its state file. It runs as a detached
// process (the smx binary's hidden `__supervise` verb), one per sandbox, so
// a crash affects one sandbox only.
package supervisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/initramfs"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/netstack"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/supproto"
	"github.com/smx-dev/smx/internal/tlsgw"
	"github.com/smx-dev/smx/internal/virtiofs"
	"github.com/smx-dev/smx/internal/vm"
)

// Options configure one supervisor run.
type Options struct {
	State     statedir.Dir
	Name      string
	AgentPath string // static smx-agent binary for the initramfs
	Logger    *slog.Logger
	// Ready receives "ok\n" once the guest answers, or one line of error;
	// then it is closed. It is how the starting CLI learns the outcome.
	Ready       io.WriteCloser
	BootTimeout time.Duration
	// Cold boots the guest even when a boot template could be restored.
	Cold bool
	// Owner, when set, is the read end of the owner pipe of a sandbox
	// that belongs to one CLI (`smx run`): end of file on it means that
	// CLI is gone, and the supervisor stops and removes the sandbox.
	Owner io.ReadCloser
	// LogCreate: the sandbox was created without its sandbox.create
	// record (smx run), which this supervisor writes first in the log.
	LogCreate bool
}

// Supervisor is one running sandbox.
type Supervisor struct {
	vfs *virtiofs.Server // the virtio-fs device's server, when mounts use it

	opts    Options
	log     *slog.Logger
	paths   sandbox.Paths
	spec    sandbox.Spec
	self    audit.Identity // which records of the log are this sandbox's own (smx-why); set with spec, never changed
	state   sandbox.State
	stateMu sync.Mutex

	machine *vm.Machine
	// session is the control session to the guest agent: replaced by
	// newSession (from the boot's goroutine, or a reconnect), ended by
	// endSessions; read it through currentSession.
	sessMu        sync.Mutex
	session       *yamux.Session
	sessionsEnded bool

	ctlConn net.Conn      // host end of the control channel; sessions come and go on it
	host    snapshot.Host // what a state saved by this QEMU needs to be restored
	restore *restorePlan  // non-nil when this run loads a saved state instead of booting
	opMu    sync.Mutex    // serialises pause, resume, suspend and snapshot
	log_    *audit.Log    // the sandbox's tamper-evident log; this process is its only writer while it runs; read once logOpen is closed
	logOpen chan struct{} // closed once openLog has finished (log_ and logErr set)
	logErr  error
	net     *netstack.Stack
	// netReady is net once it is up, for the published ports' goroutines.
	netReady atomic.Pointer[netstack.Stack]
	ports    *publish.Server // the published ports (ports.go); changed under opMu
	profile  *policy.Profile
	ca       *tlsgw.CA // the sandbox's CA for credential brokering; its certificate goes into the guest
	git      *gitgw.Gateway
	fresh    *creds.Refresher            // keeps the profile's sign-ins fresh while the sandbox runs
	ssh      sshParts                    // the SSH gateway (ssh.go)
	shares   shareSet                    // host folders (files.go)
	view     atomic.Pointer[profileView] // what the log needs of the profile (name, redaction); swapped on a profile change
	stored   storedSecrets               // the host's credential values, redacted from recorded command lines (redact.go)

	stopOnce   sync.Once
	stopping   chan struct{} // closed when a stop was asked for
	stopDone   chan struct{} // closed when the machine is down after a stop
	stopErr    error         // why the machine ended otherwise than asked, or its state could not be written
	viaErr     error         // the state finish could not write
	cleanups   []func() error
	cleanupsMu sync.Mutex
	discarded  bool        // a throwaway sandbox: remove it once down (owner.go)
	ownedDir   os.FileInfo // the sandbox directory this supervisor may remove
	listener   net.Listener
	handlers   sync.WaitGroup // in-flight API requests

	// bgCtx bounds the run-state operations and the background guest
	// syncs; a stop cancels it, so it never waits behind a long save
	// (which is abandoned: nothing is saved). bg tracks the syncs.
	bgCtx    context.Context
	cancelBg context.CancelFunc
	bg       sync.WaitGroup

	profMu sync.Mutex // serialises profile changes (setProfile)

	askOnce sync.Once
	asks    *approval.Holder // questions the gateways hold for the host user (approvals.go)

	// firstStart: the sandbox was never started (it may use a template);
	// saveTemplateAs names the template to save once a cold boot answers.
	firstStart     bool
	saveTemplateAs string
	// slimming tracks a template's conversion to its shared-RAM form
	// (slimTemplate), which the process waits for before it exits.
	slimming sync.WaitGroup

	act activity // what --idle-stop watches (limits.go)

	tracing bool // SMX_TRACE=1: log the start's phases (trace)
}

// procStart is about when this process started: the origin of the start's
// trace (SMX_TRACE=1).
var procStart = time.Now()

// trace notes, with SMX_TRACE=1 in the supervisor's environment, how long
// after the process started the sandbox's start reached phase (in
// supervisor.log); it is how the start path is profiled.
func (s *Supervisor) trace(phase string) {
	if s.tracing {
		s.log.Info("trace", "phase", phase, "ms", float64(time.Since(procStart).Microseconds())/1000)
	}
}

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

func (s *Supervisor) defer_(f func() error) {
	s.cleanupsMu.Lock() // the gateway is set up beside the boot
	defer s.cleanupsMu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

// close runs the cleanups in reverse order and joins their errors.
func (s *Supervisor) close() error {
	var errs []error
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		if err := s.cleanups[i](); err != nil {
			errs = append(errs, err)
		}
	}
	s.cleanups = nil
	return errors.Join(errs...)
}

// The sandbox's state changes only through the state table's events
// (sandbox.Apply): apply writes an event, noteEvent notes one in memory,
// update and noteState change the other fields. What is noted in memory
// only is written with the next write: it saves the start a write (and
// its fsyncs) where nobody needs the change on disk before the next one.

// apply moves the state as event ev says, lets fill set what the event
// brings, and writes it. The change is kept in memory even when it could
// not be written (it happened); the error, a refusal or a failed write,
// is the caller's to report: an operation fails with it.
func (s *Supervisor) apply(ev sandbox.Event, fill func(*sandbox.State)) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	next, err := sandbox.Change(s.paths, s.state, ev, fill)
	s.state = next
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	return nil
}

// noteEvent is apply in memory only.
func (s *Supervisor) noteEvent(ev sandbox.Event, fill func(*sandbox.State)) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	next, err := sandbox.Apply(s.state, ev)
	if err != nil {
		return err
	}
	if fill != nil {
		to := next.Status
		fill(&next)
		next.Status = to
	}
	s.state = next
	return nil
}

// update changes fields of the state other than its status and writes
// it; the change is kept in memory when it cannot be written.
func (s *Supervisor) update(fill func(*sandbox.State)) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	next, err := sandbox.Update(s.paths, s.state, fill)
	s.state = next
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	return nil
}

// noteState is update in memory only.
func (s *Supervisor) noteState(fill func(*sandbox.State)) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	st := s.state.Status
	fill(&s.state)
	s.state.Status = st
}

// status is the sandbox's status as this supervisor holds it.
func (s *Supervisor) status() sandbox.Status {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.state.Status
}

// check is the state table's word on op against the state this
// supervisor holds (the caller checked it against state.json before).
func (s *Supervisor) check(op sandbox.Op) (sandbox.Transition, error) {
	s.stateMu.Lock()
	in := &sandbox.Info{Spec: s.spec, State: s.state}
	s.stateMu.Unlock()
	return sandbox.Check(in, op)
}

// Cmdline is the guest kernel command line. quiet keeps the serial console
// (a slow device under TCG) from costing boot time.
func Cmdline(hostname string) string {
	return "console=ttyS0 panic=-1 quiet loglevel=3 smx.root=/dev/vda smx.hostname=" + hostname
}

// kernel is the guest kernel the sandbox is pinned to. A sandbox created
// when no kernel was cached (or before pinning) takes the newest cached
// one and is pinned to it from now on.
func (s *Supervisor) kernel() (*kernel.Kernel, error) {
	if s.spec.Kernel != "" {
		return kernel.Load(s.opts.State.Kernels(), s.spec.Kernel)
	}
	k, err := kernel.Find(s.opts.State.Kernels())
	if err != nil {
		return nil, err
	}
	spec := s.spec
	spec.Kernel = k.Version
	if err := sandbox.WriteSpec(s.paths, spec); err != nil {
		return nil, err
	}
	s.spec = spec
	return k, nil
}

func (s *Supervisor) boot(ctx context.Context) error {
	k, err := s.kernel()
	if err != nil {
		return err
	}
	s.trace("kernel")
	initrd, err := initramfs.Build(ctx, k, s.opts.AgentPath, s.opts.State.Initramfs())
	if err != nil {
		return err
	}
	s.trace("initramfs")
	accel, reason := vm.DetectAccel()
	if s.spec.Accel != "" {
		accel, reason = vm.Accel(s.spec.Accel), "forced by --accel"
		if s.spec.Snapshot != "" {
			reason = "using " + s.spec.Accel + ", as snapshot " + s.spec.Snapshot + " was saved (a state loads only under its own accelerator)"
		}
	}

	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("supervisor: socketpair: %w", err)
	}
	hostEnd := os.NewFile(uintptr(fds[0]), "ctl-host")
	guestEnd := os.NewFile(uintptr(fds[1]), "ctl-guest")
	hostConn, err := net.FileConn(hostEnd)
	hostEnd.Close()
	if err != nil {
		guestEnd.Close()
		return fmt.Errorf("supervisor: control channel: %w", err)
	}
	s.defer_(hostConn.Close)
	s.ctlConn = hostConn
	if s.host, err = currentHost(ctx, s.opts.State, k.Version, initrd, accel); err != nil {
		guestEnd.Close()
		return err
	}
	s.trace("qemu version")

	prof, err := s.loadProfile()
	if err != nil {
		guestEnd.Close()
		return fmt.Errorf("supervisor: profile: %w", err)
	}
	netHost, netGuest, err := netLink()
	if err != nil {
		guestEnd.Close()
		return err
	}
	defer netGuest.Close()
	os.Remove(s.paths.Console())
	cmdline := Cmdline(s.spec.Name) + netCmdline() + s.sharesCmdline(prof)
	if os.Getenv("SMX_GUEST_DEBUG") == "1" {
		// The agent then logs each boot step with its duration to the console.
		cmdline += " smx.debug=1"
	}
	cfg := vm.Config{
		Accel:     accel,
		CPUs:      s.spec.CPUs,
		MemoryMiB: s.spec.MemoryMiB,
		Kernel:    k.BootImage(),
		Initrd:    initrd,
		Cmdline:   cmdline,
		QMPSocket: "qmp.sock", // relative: the supervisor runs in the sandbox dir, and paths may exceed 108 bytes
		// The supervisor holds qmp.sock for the sandbox's life (it
		// watches QEMU's events); this one is for operators and tests.
		OperatorQMPSocket: "qmp-operator.sock",
		Devices: []vm.Device{
			vm.Console{LogPath: s.paths.Console()},
			vm.SerialPort{Name: agentproto.PortName, FD: 3},
			vm.Disk{Path: s.paths.Disk(), Format: "qcow2"},
			vm.RNG{},
			vm.NetDgram{FD: 4, MAC: guestMAC},
		},
		ExtraFiles: []*os.File{guestEnd, netGuest},
	}
	if s.wantVirtioFS(s.sharesCmdline(prof) != "") {
		qemuEnd, err := s.startVirtioFS(&cfg)
		if err != nil {
			guestEnd.Close()
			return err
		}
		defer qemuEnd.Close() // QEMU holds its own once started
	}
	s.planTemplate(ctx, cfg)
	s.trace("template planned")
	// The gateway (network stack, the sandbox's CAs, SSH gateway) is set
	// up while QEMU starts and the guest boots or loads, after the
	// template plan (a sandbox restored from a template adopts its CAs):
	// nothing the guest sends is lost meanwhile (the link is a datagram
	// socket pair that queues it), and the CAs are needed only once the
	// guest answers.
	netDone := make(chan error, 1)
	go func() {
		err := s.startNetwork(netHost, prof)
		netHost.Close() // the stack holds its own duplicate
		s.trace("network")
		netDone <- err
	}()
	joinNet := sync.OnceValue(func() error { return <-netDone })
	defer joinNet() // every way out waits for it
	bootCfg := cfg  // what a template of this machine is made from
	var stateURI string
	if s.restore != nil {
		stateFile, err := s.restore.open(s.host)
		if err != nil {
			guestEnd.Close()
			return err
		}
		defer stateFile.Close()
		cfg.ExtraFiles = append(cfg.ExtraFiles, stateFile)
		stateURI = fmt.Sprintf("fd:%d", 2+len(cfg.ExtraFiles))
		cfg.Incoming = stateURI
		// The saved memory holds the guest's kernel: QEMU gets a stand-in
		// instead of reading the real one and the initramfs for nothing.
		if standIn, err := vm.StandInKernel(filepath.Join(s.opts.State.Root, "cache")); err == nil {
			cfg.Kernel, cfg.Initrd = standIn, ""
		} else {
			s.log.Warn("no stand-in kernel for the restore", "err", err)
		}
		if s.restore.ramFile != "" {
			cfg.Incoming, cfg.RAMFile = "defer", s.restore.ramFile
		}
	}
	args, err := cfg.Args()
	if err != nil {
		guestEnd.Close()
		return err
	}
	qemu := cfg.QEMU
	if qemu == "" {
		qemu = vm.QEMUProgram()
	}
	args = append([]string{qemu}, args...)
	s.noteState(func(st *sandbox.State) {
		st.Accel, st.AccelReason, st.Kernel, st.QEMUArgs = string(accel), reason, k.Version, args
	})
	s.log.Info("starting QEMU", "accel", accel, "reason", reason, "args", strings.Join(args, " "))
	// QEMU outlives ctx: a SIGTERM to the supervisor means a graceful stop.
	m, err := vm.Start(context.WithoutCancel(ctx), cfg, s.log)
	guestEnd.Close()
	if err != nil {
		return err
	}
	s.trace("qemu started")
	s.machine = m
	s.defer_(m.Close)
	// SMX_SAVE_BANDWIDTH caps how fast snapshots and suspends write the
	// guest's state (bytes per second), to spare a busy host's disk.
	if v := os.Getenv("SMX_SAVE_BANDWIDTH"); v != "" {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
			m.SaveBandwidth = n
		} else {
			s.log.Warn("SMX_SAVE_BANDWIDTH: want bytes per second", "value", v)
		}
	}
	if err := s.update(func(st *sandbox.State) { st.QEMUPID = m.PID() }); err != nil { // status starting (Run), while QEMU starts
		return err
	}
	s.defer_(func() error { s.endSessions(); return nil })

	if s.restore != nil {
		wctx, cancel := context.WithTimeout(ctx, s.opts.BootTimeout)
		err := s.load(wctx, stateURI)
		cancel()
		if err != nil {
			if qerr := s.vmExited(vmExitGrace); qerr != nil {
				err = qerr
			}
			return fmt.Errorf("supervisor: restore from %s: %w", s.restore.label, err)
		}
		s.trace("state loaded")
		if s.restore.template != "" && s.restore.ramFile == "" {
			s.slimTemplate(s.restore.template, bootCfg)
		}
		if err := joinNet(); err != nil {
			return err
		}
		if err := s.reconnectGuest(ctx); err != nil {
			return err
		}
	} else if err := s.waitGuest(ctx); err != nil {
		return err
	} else if err := joinNet(); err != nil {
		return err
	} else if s.saveTemplateAs != "" {
		s.trace("guest up")
		if s.saveTemplate(ctx, s.saveTemplateAs) {
			s.slimTemplate(s.saveTemplateAs, bootCfg)
		}
		s.trace("template saved")
	}
	s.trace("guest up")
	s.noteState(func(st *sandbox.State) {
		st.BootMS = time.Since(st.Started).Milliseconds()
		if s.restore != nil {
			st.RestoredFrom = s.restore.label
		}
	})
	if s.restore == nil { // a restore synced the guest as it reconnected
		s.syncGuest(ctx, false)
	}
	s.trace("guest synced")
	return s.attachShares(ctx, prof)
}

// syncGuest sets the guest's clock and seeds its entropy pool: the guest
// has no RTC it can trust after a pause or a restore, and starts with an
// empty pool (or, restored, with the same pool as every other fork of its
// snapshot). After a restore it also sets the hostname, which a fork
// inherits from its source otherwise. The requests are independent, so
// they go out at once, each on its own stream: the start waits for one
// guest round trip instead of one per request. Their failures are logged;
// that of setting the clock is also returned, which after a restore
// proves the new session works (a separate health request cost the start
// its own guest code, translated afresh under TCG).
func (s *Supervisor) syncGuest(ctx context.Context, restored bool) error {
	seed := make([]byte, 64)
	rand.Read(seed)
	reqs := []*agentproto.Request{
		{Op: agentproto.OpSetTime, TimeUnixNano: time.Now().UnixNano()},
		{Op: agentproto.OpAddEntropy, Entropy: seed},
	}
	if restored {
		reqs = append(reqs, &agentproto.Request{Op: agentproto.OpSetHostname, Hostname: s.spec.Name})
	}
	// Every boot and every restore: a fork has its own CAs, and the guest
	// must trust them (and no longer its source's); a guest restored from
	// a template already trusts the template's, which its sandbox adopted.
	var guestCA []byte
	var guestSSHCA string
	if restored && s.restore != nil {
		guestCA, guestSSHCA = s.restore.guestCA, s.restore.guestSSHCA
	}
	if s.ca != nil && !bytes.Equal(guestCA, s.ca.CertPEM()) {
		reqs = append(reqs, &agentproto.Request{Op: agentproto.OpInstallCA, CACert: s.ca.CertPEM()})
	}
	if s.ssh.hostCA != nil && guestSSHCA != s.ssh.hostCA.AuthorizedKey() {
		reqs = append(reqs, s.sshGuestRequests()...)
	}
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, errs[i] = s.call(cctx, req)
			cancel()
			s.trace(req.Op)
			if errs[i] != nil {
				s.log.Warn("guest setup", "op", req.Op, "err", errs[i])
			}
		})
	}
	wg.Wait()
	return errs[0] // the clock
}

// waitGuest waits until the agent answers a health request, QEMU dies, or
// the boot timeout passes.
func (s *Supervisor) waitGuest(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.BootTimeout)
	defer cancel()
	type res struct {
		r   *agentproto.Result
		err error
	}
	ch := make(chan res, 1)
	go func() {
		if err := s.awaitHello(ctx, false); err != nil {
			ch <- res{nil, err}
			return
		}
		s.newSession()
		r, err := s.call(ctx, &agentproto.Request{Op: agentproto.OpHealth})
		ch <- res{r, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			if qerr := s.vmExited(vmExitGrace); qerr != nil {
				return fmt.Errorf("supervisor: %w", qerr)
			}
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("supervisor: guest agent did not answer within %s: see %s: %w", s.opts.BootTimeout, s.paths.Console(), errdefs.ErrUnavailable)
			}
			return fmt.Errorf("supervisor: guest agent: %w", r.err)
		}
		s.log.Info("guest up", "kernel", r.r.Kernel)
		return nil
	case <-s.machine.Done():
		return fmt.Errorf("supervisor: %w", s.vmExited(0))
	}
}

// call makes one one-shot request to the guest agent.
func (s *Supervisor) call(ctx context.Context, req *agentproto.Request) (*agentproto.Result, error) {
	sess := s.currentSession()
	if sess == nil {
		return nil, fmt.Errorf("supervisor: no session to the guest agent: %w", errdefs.ErrUnavailable)
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// A yamux Close is a half-close: only a deadline unblocks our Read
	// when the guest never answers.
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, req); err != nil {
		return nil, err
	}
	r, err := agentproto.ReadResult(st)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return r, err
}

func (s *Supervisor) listen() error {
	// Relative name: the supervisor's working directory is the sandbox
	// directory, and absolute paths may exceed the 108-byte sun_path.
	os.Remove("sup.sock")
	l, err := net.Listen("unix", "sup.sock")
	if err != nil {
		return fmt.Errorf("supervisor: listen: %w", err)
	}
	s.listener = l
	s.defer_(func() error { l.Close(); os.Remove("sup.sock"); return nil })
	return nil
}

func (s *Supervisor) serve() {
	for {
		c, err := s.listener.Accept()
		if err != nil {
			return
		}
		s.handlers.Add(1)
		go func() {
			defer s.handlers.Done()
			s.handle(c)
		}()
	}
}

// served is the state table's operation each request of supproto is
// checked against before the supervisor serves it (handle); "" for a
// request that changes nothing and needs nothing of the guest (the
// record of a refused copy, the list of published ports). A request
// missing here is refused.
var served = map[string]sandbox.Op{
	supproto.OpExec:        sandbox.OpExec,
	supproto.OpCopyIn:      sandbox.OpExec,
	supproto.OpCopyOut:     sandbox.OpExec,
	supproto.OpHealth:      sandbox.OpExec,
	supproto.OpStop:        sandbox.OpStop,
	supproto.OpDiscard:     sandbox.OpForceRemove,
	supproto.OpPause:       sandbox.OpPause,
	supproto.OpResume:      sandbox.OpResume,
	supproto.OpSuspend:     sandbox.OpSuspend,
	supproto.OpSnapshot:    sandbox.OpSnapshot,
	supproto.OpSetProfile:  sandbox.OpPolicy,
	supproto.OpPortAdd:     sandbox.OpPort,
	supproto.OpPortRemove:  sandbox.OpPort,
	supproto.OpPortList:    "",
	supproto.OpCopyRefused: "",
	// Questions are listed in any state a supervisor serves; an answer
	// can change the profile (always), as a policy change does.
	supproto.OpApprovals: "",
	supproto.OpApprove:   sandbox.OpPolicy,
}

// handle serves one client connection (internal/supproto). Every request
// is first checked against the state table (served), so that a paused or
// stopping sandbox refuses what it cannot do with the table's words. The
// requests the supervisor carries out are answered here; the rest reach
// the guest only as supproto.ToGuest rebuilds them, so a client can never
// send the guest agent a request the supervisor alone may make (set the
// clock, install a CA, mount a share, power off).
func (s *Supervisor) handle(c net.Conn) {
	defer c.Close()
	req, err := supproto.ReadRequest(c)
	if err != nil {
		if !errors.Is(err, io.EOF) {
			supproto.WriteError(c, err)
		}
		return
	}
	op, ok := served[req.Op]
	if !ok {
		supproto.WriteError(c, fmt.Errorf("supervisor: unknown op %q: %w", req.Op, errdefs.ErrInvalid))
		return
	}
	if op != "" {
		if _, err := s.check(op); err != nil {
			supproto.WriteError(c, err)
			return
		}
	}
	switch req.Op {
	case supproto.OpStop:
		timeout := time.Duration(req.TimeoutMS) * time.Millisecond
		if timeout <= 0 {
			timeout = 30 * time.Second
		}
		s.stop(timeout)
		<-s.stopDone
		if s.stopErr != nil {
			supproto.WriteError(c, s.stopErr)
			return
		}
		supproto.WriteResult(c, supproto.Result{OK: true})
		return
	case supproto.OpDiscard:
		if err := s.handleDiscard(); err != nil {
			supproto.WriteError(c, err)
			return
		}
		supproto.WriteResult(c, supproto.Result{OK: true})
		return
	case supproto.OpSetProfile:
		s.handleSetProfile(c)
		return
	case supproto.OpCopyRefused:
		// The guest's answer to a copy out broke tarfs's rules; the
		// client that refused it says so, and the agent can read why.
		s.audit(audit.KindCopyRefused, map[string]any{"op": "copy-out", "path": req.Path, "rule": "builtin: copy out", "reason": req.Reason})
		supproto.WriteResult(c, supproto.Result{OK: true})
		return
	case supproto.OpPortAdd, supproto.OpPortRemove, supproto.OpPortList:
		s.handlePort(c, req)
		return
	case supproto.OpApprovals, supproto.OpApprove:
		s.handleApprovals(c, req)
		return
	case supproto.OpPause, supproto.OpResume, supproto.OpSuspend, supproto.OpSnapshot:
		r, err := s.control(req)
		if err != nil {
			supproto.WriteError(c, err)
			return
		}
		supproto.WriteResult(c, *r)
		return
	}
	greq, err := supproto.ToGuest(req)
	if err != nil {
		supproto.WriteError(c, err)
		return
	}
	var ex *execAudit
	if greq.Op == agentproto.OpExec {
		s.trace("exec")
		s.log.Info("exec", "args", s.execRedactor().Strings(greq.Exec.Args), "user", greq.Exec.User, "tty", greq.Exec.TTY)
		if len(s.spec.Env) > 0 {
			greq.Exec.Env = append(append([]string(nil), s.spec.Env...), greq.Exec.Env...)
		}
		ex = s.execStart(greq.Exec, req.Audit)
	}
	if active(greq, req.Audit) {
		s.act.execs.Add(1)
		defer func() { s.act.touch(); s.act.execs.Add(-1) }()
	}
	sess := s.currentSession()
	if sess == nil {
		supproto.WriteError(c, fmt.Errorf("guest agent unreachable: no session: %w", errdefs.ErrUnavailable))
		ex.end(nil, errors.New("no session"))
		return
	}
	st, err := sess.OpenStream()
	if err != nil {
		supproto.WriteError(c, fmt.Errorf("guest agent unreachable: %v: %w", err, errdefs.ErrUnavailable))
		ex.end(nil, err)
		return
	}
	defer st.Close()
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, greq); err != nil {
		ex.end(nil, err)
		return
	}
	// Relay both ways. When the guest ends the stream the answer is
	// complete; when the client goes away the stream is closed, which the
	// guest takes as "kill the process".
	done := make(chan struct{})
	go func() {
		io.Copy(st, c)
		st.Close()
		close(done)
	}()
	if ex != nil {
		// The exit frame reaches the client only after exec.end is in the
		// log: whoever learns that a command ended can read that it did.
		exit, exitFrame, err := relayExec(c, st, ex)
		s.trace("exec end")
		ex.end(exit, err)
		if exitFrame != nil {
			agentproto.WriteFrame(c, agentproto.FrameExit, exitFrame)
		}
	} else {
		io.Copy(c, st)
	}
	c.Close()
	<-done
}

// execAudit follows one exec for the log.
type execAudit struct {
	s     *Supervisor
	kind  string // run or exec
	start time.Time
	pid   int
	out   int64 // bytes of stdout and stderr
}

func (s *Supervisor) execStart(req *agentproto.ExecRequest, label string) *execAudit {
	kind := audit.KindExecStart
	ex := &execAudit{s: s, kind: "exec", start: time.Now()}
	if label == "run" || label == "agent-wait" {
		kind, ex.kind = audit.KindRunStart, "run"
	}
	user := req.User
	if user == "" {
		user = "root"
	}
	// Environment names only: values may be secrets.
	var envNames []string
	for _, kv := range req.Env {
		k, _, _ := strings.Cut(kv, "=")
		envNames = append(envNames, k)
	}
	s.audit(kind, map[string]any{"args": s.execRedactor().Strings(req.Args), "user": user, "dir": req.Dir, "tty": req.TTY, "env": envNames})
	return ex
}

func (ex *execAudit) end(exit *agentproto.ExitStatus, err error) {
	if ex == nil {
		return
	}
	kind := audit.KindExecEnd
	if ex.kind == "run" {
		kind = audit.KindRunEnd
	}
	f := map[string]any{"duration_ms": time.Since(ex.start).Milliseconds(), "pid": ex.pid, "output_bytes": ex.out}
	switch {
	case exit != nil:
		f["exit_code"] = exit.Code
		if exit.Signal != 0 {
			f["signal"] = exit.Signal
		}
	case err != nil:
		f["error"] = err.Error()
	default:
		f["error"] = "client went away before the process exited (killed)"
	}
	ex.s.audit(kind, f)
}

// relayExec copies the guest's exec frames to the client, noting the PID,
// output size and exit status for the log. The exit frame itself is not
// copied but returned (raw), for the caller to send once it has logged it.
func relayExec(dst io.Writer, src io.Reader, ex *execAudit) (*agentproto.ExitStatus, []byte, error) {
	buf := make([]byte, agentproto.DataChunk+5)
	for {
		t, p, err := agentproto.ReadFrame(src, buf)
		if err != nil {
			if err == io.EOF {
				return nil, nil, nil
			}
			return nil, nil, err
		}
		if t == agentproto.FrameExit {
			var es agentproto.ExitStatus
			if err := json.Unmarshal(p, &es); err != nil {
				return nil, nil, err
			}
			return &es, append([]byte(nil), p...), nil
		}
		if err := agentproto.WriteFrame(dst, t, p); err != nil {
			return nil, nil, nil // the client went away
		}
		switch t {
		case agentproto.FrameStarted:
			var st agentproto.Started
			if json.Unmarshal(p, &st) == nil {
				ex.pid = st.PID
			}
		case agentproto.FrameStdout, agentproto.FrameStderr:
			ex.out += int64(len(p))
			ex.s.act.touch()
		case agentproto.FrameError:
			return nil, nil, agentproto.DecodeError(p)
		}
	}
}

// openLog opens the sandbox's log as its single writer for the life of
// this process.
func (s *Supervisor) openLog() error {
	if err := s.opts.State.Ensure(); err != nil {
		return err
	}
	key, err := audit.LoadOrCreatePinnedKey(s.opts.State.Audit())
	if err != nil {
		return fmt.Errorf("supervisor: log key: %w", err)
	}
	l, err := audit.Open(audit.Dir(s.opts.State.Logs(), s.opts.Name), s.opts.Name, key.Signer())
	if err != nil {
		return fmt.Errorf("supervisor: open log: %w", err)
	}
	s.log_ = l
	return nil
}

// audit appends to the sandbox log, once it is open. A record that cannot
// be written (disk full) is reported in the supervisor's own log; the
// sandbox keeps running.
func (s *Supervisor) audit(kind string, fields map[string]any) {
	if <-s.logOpen; s.log_ == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.log_.Append(ctx, kind, fields); err != nil {
		s.log.Error("audit append", "kind", kind, "err", err)
	}
}

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

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func firstLine(err error) string {
	if err == nil {
		return "ok"
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// AgentPath finds the smx-agent binary: $SMX_AGENT, else next to the smx
// executable.
func AgentPath() (string, error) {
	if p := os.Getenv("SMX_AGENT"); p != "" {
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), "smx-agent")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("supervisor: smx-agent not found next to %s: build it with `make` or set SMX_AGENT: %w", exe, errdefs.ErrUnavailable)
	}
	return p, nil
}
