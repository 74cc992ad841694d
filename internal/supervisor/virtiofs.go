package supervisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/vhostuser"
	"github.com/smx-dev/smx/internal/virtiofs"
	"github.com/smx-dev/smx/internal/vm"
)

// virtioFSTag is the tag of the sandbox's one virtio-fs device; every mount
// is a directory of it that the guest binds in place.
const virtioFSTag = "smx"

// wantVirtioFS says whether this start serves mounts over virtio-fs: asked
// for (SMX_FILES_TRANSPORT=virtiofs, a host-side setting), a QEMU of 8.2 or
// newer, and mounts to serve. Not yet the default: the backend offers no
// dirty logging or device state, so QEMU refuses to snapshot, suspend or
// template a sandbox with the device; mounts stay on 9P, which keeps those
// working, until it does.
func (s *Supervisor) wantVirtioFS(hasMounts bool) bool {
	return hasMounts && os.Getenv("SMX_FILES_TRANSPORT") == "virtiofs" && s.restore == nil && vm.VirtioFSCapable(s.host.QEMUVersion)
}

// startVirtioFS serves the virtio-fs device's vhost-user socket and adds
// the device to cfg, with guest RAM shared with the supervisor (the
// device's buffers are guest memory the supervisor maps). It returns
// QEMU's end of the socket, to be closed once QEMU holds it.
func (s *Supervisor) startVirtioFS(cfg *vm.Config) (*os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("supervisor: virtio-fs socketpair: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "vhost-user-fs")
	qemuEnd := os.NewFile(uintptr(fds[1]), "vhost-user-fs-qemu")
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		qemuEnd.Close()
		return nil, fmt.Errorf("supervisor: virtio-fs socket: %w", err)
	}
	conn := c.(*net.UnixConn)
	// SMX_VIRTIOFS_CACHE (a duration, host side) lets the guest keep
	// names and attributes that long; unset, every lookup reaches the
	// profile. For measuring what the guest's cache is worth
	// (BenchmarkFilesVirtioFS); see virtiofs.Server.SetCacheTimeout.
	var cache time.Duration
	if v := os.Getenv("SMX_VIRTIOFS_CACHE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Minute {
			qemuEnd.Close()
			conn.Close()
			return nil, fmt.Errorf("supervisor: SMX_VIRTIOFS_CACHE=%q: want a duration from 0 to 1m, like 1s", v)
		}
		cache = d
	}
	log := s.log.With("device", "virtio-fs")
	s.vfs = virtiofs.NewMounts(nil, log)
	s.vfs.SetCacheTimeout(cache)
	s.defer_(func() error { s.vfs.Close(); return nil })
	s.defer_(conn.Close)
	// Under TCG the guest copies the device's buffers through swiotlb
	// with its own CPU: QEMU's translated code of a page is dropped only
	// when QEMU sees the page written, and the supervisor writes guest
	// RAM from another process, so a program read from the mount again
	// into the same pages would otherwise run its old code (or crash).
	// KVM has no translated code. SMX_VIRTIOFS_BOUNCE=0 or 1 overrides.
	bounce := cfg.Accel == vm.AccelTCG
	if v := os.Getenv("SMX_VIRTIOFS_BOUNCE"); v != "" {
		bounce = v == "1"
	}
	var features uint64
	if bounce {
		features = vhostuser.FeatureAccessPlatform
		cfg.Cmdline += " swiotlb=force"
	}
	go func() {
		// A malformed ring or FUSE message ends this device only: the
		// guest's mounts fail, the sandbox and supervisor carry on.
		err := vhostuser.Serve(context.Background(), conn, vhostuser.Config{Queues: virtiofs.Queues, Handler: s.vfs, Log: log, Features: features})
		if err != nil {
			log.Warn("virtio-fs device ended", "err", err)
		}
	}()
	cfg.ExtraFiles = append(cfg.ExtraFiles, qemuEnd)
	cfg.Devices = append(cfg.Devices, vm.VirtioFS{Tag: virtioFSTag, FD: 2 + len(cfg.ExtraFiles), Bounce: bounce})
	cfg.SharedRAM = true
	return qemuEnd, nil
}
