package supervisor

import (
	"context"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/vhostuser"
	"github.com/smx-dev/smx/internal/virtiofs"
	"github.com/smx-dev/smx/internal/vm"
)

// virtioFSTag is the tag of the sandbox's one virtio-fs device; every mount
// is a directory of it that the guest binds in place.
const virtioFSTag = "smx"

// virtioFSByDefault makes virtio-fs the transport of mounts on a QEMU of
// 8.2 or newer when SMX_FILES_TRANSPORT does not choose one. Off while
// the backend saves no device state (dirty logging, DEVICE_STATE): until
// then QEMU refuses to snapshot, suspend or template a sandbox with the
// device, which the 9P fallback allows. Turned on with that support.
const virtioFSByDefault = false

// wantVirtioFS says whether this start serves mounts over virtio-fs: mounts
// to serve, a fresh boot, a QEMU of 8.2 or newer (the 9P gateway serves
// them on an older one), and either SMX_FILES_TRANSPORT=virtiofs (a
// host-side setting) or, with virtioFSByDefault, no transport chosen.
func (s *Supervisor) wantVirtioFS(hasMounts bool) bool {
	if !hasMounts || s.restore != nil || !vm.VirtioFSCapable(s.host.QEMUVersion) {
		return false
	}
	switch os.Getenv("SMX_FILES_TRANSPORT") {
	case "virtiofs":
		return true
	case "":
		return virtioFSByDefault
	}
	return false // a 9P transport, chosen for a measurement
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
	log := s.log.With("device", "virtio-fs")
	s.vfs = virtiofs.NewMounts(nil, log)
	s.defer_(func() error { s.vfs.Close(); return nil })
	s.defer_(conn.Close)
	go func() {
		// A malformed ring or FUSE message ends this device only: the
		// guest's mounts fail, the sandbox and supervisor carry on.
		err := vhostuser.Serve(context.Background(), conn, vhostuser.Config{Queues: virtiofs.Queues, Handler: s.vfs, Log: log})
		if err != nil {
			log.Warn("virtio-fs device ended", "err", err)
		}
	}()
	cfg.ExtraFiles = append(cfg.ExtraFiles, qemuEnd)
	cfg.Devices = append(cfg.Devices, vm.VirtioFS{Tag: virtioFSTag, FD: 2 + len(cfg.ExtraFiles)})
	cfg.SharedRAM = true
	return qemuEnd, nil
}
