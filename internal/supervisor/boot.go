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
