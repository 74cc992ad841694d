// The boot: the sandbox's machine started as a list of named steps, from
// the kernel to the guest agent's first answer.

package supervisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/initramfs"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/vm"
)

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

// boot starts the sandbox's machine: the steps of bootSteps, in order,
// each traced by name (a debug line with its duration); the first that
// fails ends the boot, and its name is in the error. What a step sets up
// for the next ones is in booting; what it holds only for the boot's
// length (the defers of one function) it releases in booting.undo, which
// runs last first when the boot returns, however it ends.
func (s *Supervisor) boot(ctx context.Context) error {
	b := &booting{s: s}
	defer b.release()
	for _, step := range b.steps() {
		start := time.Now()
		err := step.run(ctx)
		s.log.Debug("boot step", "step", step.name, "took", time.Since(start), "err", err)
		if err != nil {
			return fmt.Errorf("boot: %s: %w", step.name, err)
		}
	}
	return nil
}

// bootStep is one named step of the boot (firecracker-go-sdk's handler
// lists, u-root's init steps): the name is what the trace and the error
// of a boot that fails there call it.
type bootStep struct {
	name string
	run  func(ctx context.Context) error
}

// booting is one boot's progress: what its steps hand each other.
type booting struct {
	s *Supervisor

	k        *kernel.Kernel
	initrd   string
	accel    vm.Accel
	reason   string   // why accel
	guestEnd *os.File // the guest's end of the control channel, until QEMU holds it
	prof     *policy.Profile
	netHost  *os.File // the host's end of the network link, until the stack holds it
	netGuest *os.File
	cfg      vm.Config // the machine QEMU starts
	bootCfg  vm.Config // what a template of this machine is made from
	stateURI string    // where QEMU loads a saved state from, when it restores
	joinNet  func() error

	undo []func() // released when the boot returns, last first
}

// steps is the boot, in order.
func (b *booting) steps() []bootStep {
	return []bootStep{
		{"kernel", b.findKernel},
		{"initramfs", b.buildInitramfs},
		{"accelerator", b.chooseAccel},
		{"control channel", b.openControlChannel},
		{"qemu version", b.probeQEMU},
		{"profile", b.loadProfile},
		{"network link", b.linkNetwork},
		{"machine", b.configureMachine},
		{"template plan", b.planTemplate},
		{"network", b.startNetwork},
		{"saved state", b.openSavedState},
		{"qemu", b.startQEMU},
		{"guest", b.awaitGuest},
		{"guest sync", b.syncGuest},
		{"shares", b.attachShares},
	}
}

// defer_ holds f for the boot's length.
func (b *booting) defer_(f func()) { b.undo = append(b.undo, f) }

func (b *booting) release() {
	for i := len(b.undo) - 1; i >= 0; i-- {
		b.undo[i]()
	}
}

func (b *booting) findKernel(ctx context.Context) error {
	s := b.s
	k, err := s.kernel()
	if err != nil {
		return err
	}
	b.k = k
	s.trace("kernel")
	return nil
}

func (b *booting) buildInitramfs(ctx context.Context) error {
	s := b.s
	initrd, err := initramfs.Build(ctx, b.k, s.opts.AgentPath, s.opts.State.Initramfs())
	if err != nil {
		return err
	}
	b.initrd = initrd
	s.trace("initramfs")
	return nil
}

func (b *booting) chooseAccel(ctx context.Context) error {
	s := b.s
	accel, reason := vm.DetectAccel()
	if s.spec.Accel != "" {
		accel, reason = vm.Accel(s.spec.Accel), "forced by --accel"
		if s.spec.Snapshot != "" {
			reason = "using " + s.spec.Accel + ", as snapshot " + s.spec.Snapshot + " was saved (a state loads only under its own accelerator)"
		}
	}
	b.accel, b.reason = accel, reason
	return nil
}

func (b *booting) openControlChannel(ctx context.Context) error {
	s := b.s
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
	b.guestEnd = guestEnd
	return nil
}

func (b *booting) probeQEMU(ctx context.Context) error {
	s := b.s
	var err error
	if s.host, err = currentHost(ctx, s.opts.State, b.k.Version, b.initrd, b.accel); err != nil {
		b.guestEnd.Close()
		return err
	}
	s.trace("qemu version")
	return nil
}

func (b *booting) loadProfile(ctx context.Context) error {
	prof, err := b.s.loadProfile()
	if err != nil {
		b.guestEnd.Close()
		return fmt.Errorf("supervisor: profile: %w", err)
	}
	b.prof = prof
	return nil
}

func (b *booting) linkNetwork(ctx context.Context) error {
	netHost, netGuest, err := netLink()
	if err != nil {
		b.guestEnd.Close()
		return err
	}
	b.netHost, b.netGuest = netHost, netGuest
	b.defer_(func() { netGuest.Close() })
	return nil
}

func (b *booting) configureMachine(ctx context.Context) error {
	s := b.s
	os.Remove(s.paths.Console())
	cmdline := Cmdline(s.spec.Name) + netCmdline() + s.sharesCmdline(b.prof)
	if os.Getenv("SMX_GUEST_DEBUG") == "1" {
		// The agent then logs each boot step with its duration to the console.
		cmdline += " smx.debug=1"
	}
	b.cfg = vm.Config{
		Accel:     b.accel,
		CPUs:      s.spec.CPUs,
		MemoryMiB: s.spec.MemoryMiB,
		Kernel:    b.k.BootImage(),
		Initrd:    b.initrd,
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
		ExtraFiles: []*os.File{b.guestEnd, b.netGuest},
	}
	if s.wantVirtioFS(s.sharesCmdline(b.prof) != "") {
		qemuEnd, err := s.startVirtioFS(&b.cfg, b.prof)
		if err != nil {
			b.guestEnd.Close()
			return err
		}
		b.defer_(func() { qemuEnd.Close() }) // QEMU holds its own once started
	}
	return nil
}

func (b *booting) planTemplate(ctx context.Context) error {
	s := b.s
	s.planTemplate(ctx, b.cfg)
	s.trace("template planned")
	return nil
}

// startNetwork sets up the gateway (network stack, the sandbox's CAs, SSH
// gateway) while QEMU starts and the guest boots or loads, after the
// template plan (a sandbox restored from a template adopts its CAs):
// nothing the guest sends is lost meanwhile (the link is a datagram
// socket pair that queues it), and the CAs are needed only once the
// guest answers.
func (b *booting) startNetwork(ctx context.Context) error {
	s := b.s
	netHost, prof := b.netHost, b.prof
	netDone := make(chan error, 1)
	go func() {
		err := s.startNetwork(netHost, prof)
		netHost.Close() // the stack holds its own duplicate
		s.trace("network")
		netDone <- err
	}()
	b.joinNet = sync.OnceValue(func() error { return <-netDone })
	b.defer_(func() { b.joinNet() }) // every way out waits for it
	return nil
}

func (b *booting) openSavedState(ctx context.Context) error {
	s := b.s
	b.bootCfg = b.cfg // what a template of this machine is made from
	if s.restore != nil {
		stateFile, firmware, err := s.restore.open(s.host)
		if err != nil {
			b.guestEnd.Close()
			return err
		}
		b.cfg.Firmware = firmware
		b.defer_(func() { stateFile.Close() })
		b.cfg.ExtraFiles = append(b.cfg.ExtraFiles, stateFile)
		b.stateURI = fmt.Sprintf("fd:%d", 2+len(b.cfg.ExtraFiles))
		b.cfg.Incoming = b.stateURI
		// The saved memory holds the guest's kernel: QEMU gets a stand-in
		// instead of reading the real one and the initramfs for nothing.
		if standIn, err := vm.StandInKernel(filepath.Join(s.opts.State.Root, "cache")); err == nil {
			b.cfg.Kernel, b.cfg.Initrd = standIn, ""
		} else {
			s.log.Warn("no stand-in kernel for the restore", "err", err)
		}
		if s.restore.ramFile != "" {
			b.cfg.Incoming, b.cfg.RAMFile = "defer", s.restore.ramFile
		}
	}
	return nil
}

func (b *booting) startQEMU(ctx context.Context) error {
	s := b.s
	cfg, accel, reason, k := b.cfg, b.accel, b.reason, b.k
	args, err := cfg.Args()
	if err != nil {
		b.guestEnd.Close()
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
	b.guestEnd.Close()
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
	s.qemuPID.Store(int64(m.PID()))
	if err := s.update(func(st *sandbox.State) { st.QEMUPID = m.PID() }); err != nil { // status starting (Run), while QEMU starts
		return err
	}
	s.defer_(func() error { s.endSessions(); return nil })
	return nil
}

// awaitGuest waits for the guest agent: a restored guest is loaded and
// reconnected, a booted one answers (and, the first time, is saved as a
// template).
func (b *booting) awaitGuest(ctx context.Context) error {
	s := b.s
	if s.restore != nil {
		wctx, cancel := context.WithTimeout(ctx, s.opts.BootTimeout)
		err := s.load(wctx, b.stateURI)
		cancel()
		if err != nil {
			if qerr := s.vmExited(vmExitGrace); qerr != nil {
				err = qerr
			}
			return fmt.Errorf("supervisor: restore from %s: %w", s.restore.label, err)
		}
		s.trace("state loaded")
		if s.restore.template != "" && s.restore.ramFile == "" {
			s.slimTemplate(s.restore.template, b.bootCfg)
		}
		if err := b.joinNet(); err != nil {
			return err
		}
		if err := s.reconnectGuest(ctx); err != nil {
			return err
		}
	} else if err := s.waitGuest(ctx); err != nil {
		return err
	} else if err := b.joinNet(); err != nil {
		return err
	} else if s.saveTemplateAs != "" {
		s.trace("guest up")
		if s.saveTemplate(ctx, s.saveTemplateAs) {
			s.slimTemplate(s.saveTemplateAs, b.bootCfg)
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
	return nil
}

func (b *booting) syncGuest(ctx context.Context) error {
	s := b.s
	if s.restore == nil { // a restore synced the guest as it reconnected
		s.syncGuest(ctx, false)
	}
	s.trace("guest synced")
	return nil
}

func (b *booting) attachShares(ctx context.Context) error {
	return b.s.attachShares(ctx, b.prof)
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
