package guest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
)

// Server answers agentproto requests. One Server serves any number of
// sessions and streams concurrently.
type Server struct {
	// Log receives request-level diagnostics. Required.
	Log *slog.Logger
	// Reaper collects exit statuses of started processes. Required.
	Reaper *Reaper
	// PowerOff is called after an OpPowerOff request has been answered.
	// Nil means power-off is refused (the agent is not PID 1).
	PowerOff func()
	// DrainTimeout bounds how long output is still read after the process
	// has exited: a background child that keeps stdout open must not hold
	// the exit status back for ever. Zero means 3 s.
	DrainTimeout time.Duration
	// PasswdPath and GroupPath default to /etc/passwd and /etc/group.
	PasswdPath, GroupPath string
	// Settled, when set, is waited for before a request that touches
	// the user's files or processes (exec, copies, mounts): boot steps
	// still running in the background (Boot.Settled).
	Settled func()
}

// YamuxConfig is the session configuration for the control channel. The
// host may pause the VM for snapshots, so keepalives are off and writes
// get a generous timeout.
func YamuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.EnableKeepAlive = false
	c.ConnectionWriteTimeout = 60 * time.Second
	c.MaxStreamWindowSize = 1 << 20
	c.LogOutput = io.Discard
	return c
}

// Serve runs a yamux server session over conn until the session ends or
// ctx is done, handling each accepted stream as one request. It closes conn.
// Requests still running when the session ends see their streams fail and
// clean up (exec kills its process group).
func (s *Server) Serve(ctx context.Context, conn io.ReadWriteCloser) error {
	sess, err := yamux.Server(conn, YamuxConfig())
	if err != nil {
		conn.Close()
		return fmt.Errorf("guest: serve: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()
	defer sess.Close()
	for {
		st, err := sess.AcceptStream()
		if err != nil {
			if ctx.Err() != nil || sess.IsClosed() || errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("guest: serve: accept: %w", err)
		}
		go s.ServeStream(ctx, st)
	}
}

// ServeStream handles one request on stream and closes it.
func (s *Server) ServeStream(ctx context.Context, stream io.ReadWriteCloser) {
	defer stream.Close()
	w := &agentproto.LockedWriter{W: stream}
	req, err := agentproto.ReadRequest(stream)
	if err != nil {
		s.Log.Debug("bad request", "err", err)
		writeError(w, fmt.Errorf("guest: %w", err))
		return
	}
	s.Log.Debug("request", "op", req.Op)
	start := time.Now()
	defer func() { s.Log.Debug("request done", "op", req.Op, "took", time.Since(start)) }()
	switch req.Op {
	case agentproto.OpExec, agentproto.OpCopyIn, agentproto.OpCopyOut, agentproto.OpMount, agentproto.OpMountData:
		if s.Settled != nil {
			s.Settled()
		}
	}
	switch req.Op {
	case agentproto.OpExec:
		err = s.exec(ctx, w, stream, req.Exec)
	case agentproto.OpCopyIn:
		err = s.copyIn(w, stream, req.Path)
	case agentproto.OpCopyOut:
		err = s.copyOut(w, req.Path)
	case agentproto.OpHealth:
		err = s.health(w)
	case agentproto.OpSetTime:
		err = setTime(w, req.TimeUnixNano)
	case agentproto.OpAddEntropy:
		err = addEntropy(w, req.Entropy)
	case agentproto.OpSetHostname:
		err = setHostname(w, req.Hostname)
	case agentproto.OpInstallCA:
		err = installCA(w, req.CACert)
	case agentproto.OpInstallSSHCA:
		err = installSSHCA(w, req.SSHKnownHosts)
	case agentproto.OpPowerOff:
		err = s.powerOff(w)
	case agentproto.OpSettle:
		err = settleRequest(w, req.LimitMS)
	case agentproto.OpMountData:
		err = s.mountData(stream, req.Mount)
	case agentproto.OpMount:
		err = s.mountShare(w, req.Mount)
	case agentproto.OpUnmount:
		err = unbindVirtioFS(w, req.Mount)
	case agentproto.OpDial:
		err = dialLoopback(ctx, w, stream, req.Port)
	default:
		err = fmt.Errorf("guest: unknown op %q", req.Op)
	}
	if err != nil {
		s.Log.Debug("request failed", "op", req.Op, "err", err)
		writeError(w, err)
	}
}

// writeError sends err as a FrameError. Failures are ignored: the stream is
// being given up on anyway.
func writeError(w io.Writer, err error) {
	e := agentproto.ErrorOf(err)
	e.ExitCode = startExitCode(err)
	_ = agentproto.WriteJSON(w, agentproto.FrameError, e)
}

func (s *Server) health(w io.Writer) error {
	res := agentproto.Result{OK: true}
	if b, err := os.ReadFile("/proc/version"); err == nil {
		res.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/uptime"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			res.Uptime, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	res.Hostname, _ = os.Hostname()
	return agentproto.WriteJSON(w, agentproto.FrameResult, res)
}

func setTime(w io.Writer, unixNano int64) error {
	if unixNano <= 0 {
		return errors.New("guest: set-time: no time given")
	}
	ts := unix.NsecToTimespec(unixNano)
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("guest: set-time: %w", err)
	}
	return agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true})
}

// addEntropy mixes host randomness into the guest pool and credits it, so
// that getrandom() does not block early in a fresh VM.
func addEntropy(w io.Writer, data []byte) error {
	if len(data) == 0 {
		return errors.New("guest: add-entropy: no data")
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("guest: add-entropy: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+len(data))
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(data)*8))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(data)))
	copy(buf[8:], data)
	sc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("guest: add-entropy: %w", err)
	}
	var ioErr error
	err = sc.Control(func(fd uintptr) {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0])))
		if errno != 0 {
			ioErr = errno
		}
	})
	if err == nil {
		err = ioErr
	}
	if err != nil {
		return fmt.Errorf("guest: add-entropy: RNDADDENTROPY: %w", err)
	}
	// Reseed the CRNG now rather than at its next scheduled reseed: after
	// a restore, every fork of one snapshot starts from the same CRNG
	// state, and only a reseed makes them diverge at once. ENODATA means
	// the CRNG is not initialised yet, when it seeds from the pool anyway.
	sc.Control(func(fd uintptr) {
		unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDRESEEDCRNG, 0)
	})
	return agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true})
}

func setHostname(w io.Writer, name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("guest: set-hostname: bad name %q", name)
	}
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("guest: set-hostname: %w", err)
	}
	return agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true})
}

func (s *Server) powerOff(w io.Writer) error {
	if s.PowerOff == nil {
		return errors.New("guest: poweroff: not running as init")
	}
	err := agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true})
	s.Log.Info("power off requested")
	go s.PowerOff()
	return err
}
