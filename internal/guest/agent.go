package guest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
)

// Main is smx-agent's entry point. As PID 1 it never returns: it boots the
// guest and serves the control port; on a fatal error it logs and powers
// the VM off, because an exiting PID 1 panics the kernel.
func Main() {
	if os.Getpid() != 1 && len(os.Args) == 2 && os.Args[1] == "sftp-server" {
		os.Exit(serveSFTP())
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "smx-agent: this is the guest init of an smx microVM; it only runs as PID 1")
		os.Exit(2)
	}
	level := new(slog.LevelVar)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("c", "smx-agent")
	guardSignals(log)
	defer func() {
		if r := recover(); r != nil {
			log.Error("panic", "value", r)
			powerOff(log)
		}
	}()

	// Reap from the start: nothing else in this process may wait for children.
	reaper := NewReaper(true)
	b := &Boot{Log: log, Level: level}
	if err := b.Run(Steps()); err != nil {
		log.Error("boot failed; powering off", "err", err)
		powerOff(log)
	}
	log.Info("guest up", "hostname", b.Cmdline.Hostname, "root", b.Cmdline.Root)

	srv := &Server{Log: log, Reaper: reaper, PowerOff: func() { powerOff(log) }, Settled: b.Settled}
	ServeControlPort(context.Background(), log, srv)
	log.Error("control port loop ended; powering off")
	powerOff(log)
}

// guardSignals keeps signals that would make the Go runtime exit (and so
// panic the kernel) from ending PID 1. Notify rather than Ignore: ignored
// signals stay ignored in every process the agent starts.
func guardSignals(log *slog.Logger) {
	ch := make(chan os.Signal, 8)
	signal.Notify(ch, unix.SIGHUP, unix.SIGINT, unix.SIGQUIT, unix.SIGILL, unix.SIGTRAP,
		unix.SIGABRT, unix.SIGBUS, unix.SIGFPE, unix.SIGSEGV, unix.SIGTERM, unix.SIGSTKFLT,
		unix.SIGSYS, unix.SIGPIPE)
	go func() {
		for s := range ch {
			if s != unix.SIGPIPE {
				log.Info("ignoring signal sent to init", "signal", s)
			}
		}
	}()
}

// ServeControlPort finds the agentproto.PortName virtio-serial port and
// serves yamux sessions on it until ctx is done. A session ends when the
// host side disconnects (the port then reads as end of file); each new
// host connection gets a new session, so the host must start a fresh yamux
// client whenever it (re)connects.
func ServeControlPort(ctx context.Context, log *slog.Logger, srv *Server) {
	var dev string
	start := time.Now()
	warned := false
	for ctx.Err() == nil {
		var err error
		if dev, err = findPort(agentproto.PortName); err == nil {
			break
		}
		if !warned && time.Since(start) > 5*time.Second {
			log.Error("control port not found; still waiting", "port", agentproto.PortName, "err", err)
			warned = true
		}
		time.Sleep(20 * time.Millisecond)
	}
	// This descriptor stays open for good, so the port never looks closed
	// to QEMU between sessions; each session gets its own duplicate, whose
	// close also stops that session's reader.
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		log.Error("open control port", "dev", dev, "err", err)
		return
	}
	for ctx.Err() == nil {
		waitHostConnected(ctx, fd)
		sfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			log.Error("dup control port", "err", err)
			time.Sleep(time.Second)
			continue
		}
		log.Debug("control session starting")
		f := os.NewFile(uintptr(sfd), dev)
		if _, err := f.Write([]byte(agentproto.SessionHello)); err != nil {
			log.Warn("control session hello", "err", err)
			f.Close()
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err := srv.Serve(ctx, &skipPoison{ReadWriteCloser: f}); err != nil {
			log.Warn("control session", "err", err)
		}
		log.Debug("control session ended")
	}
}

// skipPoison drops the agentproto.SessionPoison bytes a host sends ahead
// of a new session (see agentproto.SessionHello).
type skipPoison struct {
	io.ReadWriteCloser
	started bool
}

func (s *skipPoison) Read(p []byte) (int, error) {
	for !s.started {
		n, err := s.ReadWriteCloser.Read(p)
		i := 0
		for i < n && p[i] == agentproto.SessionPoison {
			i++
		}
		if i < n {
			s.started = true
			return copy(p, p[i:n]), nil
		}
		if err != nil {
			return 0, err
		}
	}
	return s.ReadWriteCloser.Read(p)
}

// waitHostConnected waits until the host end of the port is open. A
// virtio-serial port polls as hung up while no host is connected, and
// reads then return end of file at once.
func waitHostConnected(ctx context.Context, fd int) {
	for ctx.Err() == nil {
		// POLLOUT too: a connected port is writable at once, while the
		// host, since the session hello, sends nothing until it has read
		// ours, so waiting for POLLIN alone would sit out the timeout.
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLOUT}}
		n, err := unix.Poll(pfd, 1000)
		if err == nil && (n == 0 || pfd[0].Revents&unix.POLLHUP == 0) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// findPort returns the /dev node of the virtio-serial port with name.
func findPort(name string) (string, error) {
	dirs, err := filepath.Glob("/sys/class/virtio-ports/*/name")
	if err != nil {
		return "", err
	}
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if strings.TrimSpace(string(b)) == name {
			return "/dev/" + filepath.Base(filepath.Dir(p)), nil
		}
	}
	return "", fmt.Errorf("no virtio port named %q among %d ports", name, len(dirs))
}

// Hostname sets the hostname from smx.hostname.
type Hostname struct{}

func (Hostname) String() string { return "set hostname" }

func (Hostname) Run(b *Boot) error {
	name := b.Cmdline.Hostname
	if name == "" {
		name = "smx"
	}
	if err := unix.Sethostname([]byte(name)); err != nil {
		b.Log.Warn("sethostname failed", "name", name, "err", err)
	}
	return nil
}

// Loopback brings up lo; the kernel then gives it 127.0.0.1 and ::1.
type Loopback struct{}

func (Loopback) String() string { return "bring up lo" }

func (Loopback) Run(b *Boot) error {
	if err := linkUp("lo"); err != nil {
		b.Log.Warn("loopback", "err", err)
	}
	return nil
}

func linkUp(name string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get flags of %s: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	return nil
}

// powerOff stops every process (TERM, a short grace, KILL), flushes and
// remounts the root read-only, and powers the VM off. It does not return.
func powerOff(log *slog.Logger) {
	_ = unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && userProcesses() > 0 {
		time.Sleep(50 * time.Millisecond)
	}
	_ = unix.Kill(-1, unix.SIGKILL)
	for i := 0; i < 20 && userProcesses() > 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	unix.Sync()
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		log.Debug("remount / read-only", "err", err)
	}
	unix.Sync()
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	log.Error("power off failed; halting", "err", err)
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_HALT)
	select {}
}

// userProcesses counts live processes other than the agent, skipping
// kernel threads and zombies.
func userProcesses() int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	self := os.Getpid()
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after "(comm)": state ppid pgrp session tty_nr tpgid flags.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 7 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		flags, _ := strconv.ParseUint(f[6], 10, 64)
		const pfKthread = 0x00200000
		if flags&pfKthread != 0 {
			continue
		}
		n++
	}
	return n
}
