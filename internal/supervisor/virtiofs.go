package supervisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/vhostuser"
	"github.com/smx-dev/smx/internal/virtiofs"
	"github.com/smx-dev/smx/internal/vm"
)

// virtioFSTag is the tag of the sandbox's one virtio-fs device; every mount
// is a directory of it that the guest binds in place.
const virtioFSTag = "smx"

// virtioFSByDefault makes virtio-fs the transport of mounts on a QEMU of
// 8.2 or newer when SMX_FILES_TRANSPORT does not choose one. Off: a
// shared writable mmap of a file in the share crashed Go's telemetry
// there (not yet understood), and under TCG (every host without KVM, CI's
// too) the bounce buffers that keep programs run from the share correct
// cost a third of read throughput; until then virtio-fs is opt-in and 9P
// serves mounts.
const virtioFSByDefault = false

// wantVirtioFS says whether this start serves mounts over virtio-fs. A
// restore declares the device exactly when the saved machine had it (QEMU
// loads a state only into the same devices), mounts or not. A boot uses
// it with mounts to serve, a QEMU of 8.2 or newer (whose vhost-user-fs
// migrates the device's state; the 9P gateway serves them on an older
// one), and either SMX_FILES_TRANSPORT=virtiofs (a host-side setting) or,
// with virtioFSByDefault, no transport chosen.
func (s *Supervisor) wantVirtioFS(hasMounts bool) bool {
	if s.restore != nil {
		saved, err := snapshot.ReadHost(s.restore.hostPath)
		return err == nil && saved.VirtioFS
	}
	if !hasMounts || !vm.VirtioFSCapable(s.host.QEMUVersion) {
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

// startVirtioFS serves the virtio-fs device's vhost-user socket, opens the
// gateway of every mount under prof (before QEMU starts: a restore loads
// the device's state, whose names are resolved through them, while QEMU
// loads the machine) and adds the device to cfg, with guest RAM shared
// with the supervisor (the device's buffers are guest memory the
// supervisor maps). It returns QEMU's end of the socket, to be closed
// once QEMU holds it.
func (s *Supervisor) startVirtioFS(cfg *vm.Config, prof *policy.Profile) (*os.File, error) {
	log := s.log.With("device", "virtio-fs")
	s.vfs = virtiofs.NewMounts(nil, log)
	s.defer_(func() error { s.vfs.Close(); return nil })
	list, err := s.shareList(prof)
	if err != nil {
		return nil, err
	}
	s.shares.profile.Store(prof)
	s.shares.nextTag = len(list)
	for _, sh := range list {
		if err := s.openGateway(sh); err != nil {
			return nil, err
		}
		root, err := sh.gw.Attach()
		if err != nil {
			return nil, fmt.Errorf("supervisor: mount %s: %w", sh.mount.Rule, err)
		}
		s.vfs.AddMountAt(sh.tag, sh.mount.Guest, root)
		s.shares.mu.Lock()
		s.shares.list = append(s.shares.list, sh)
		s.shares.mu.Unlock()
	}
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
	s.vfs.SetCacheTimeout(cache)
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
		err := vhostuser.Serve(context.Background(), conn, vhostuser.Config{
			Queues:      virtiofs.Queues,
			Handler:     s.vfs,
			State:       s.vfs,
			FrontEndPID: func() int { return int(s.qemuPID.Load()) },
			Log:         log,
			Features:    features,
		})
		if err != nil {
			log.Warn("virtio-fs device ended", "err", err)
		}
	}()
	cfg.ExtraFiles = append(cfg.ExtraFiles, qemuEnd)
	cfg.Devices = append(cfg.Devices, vm.VirtioFS{Tag: virtioFSTag, FD: 2 + len(cfg.ExtraFiles), Bounce: bounce})
	cfg.SharedRAM = true
	s.host.VirtioFS = true
	return qemuEnd, nil
}

// mountVirtioFS has the guest bind each mount's directory of the device
// in place, except those a restored guest has already (the loaded state
// names the tag at the same mount point).
func (s *Supervisor) mountVirtioFS(ctx context.Context) error {
	had := s.vfs.LoadedMounts()
	s.shares.mu.Lock()
	list := append([]*share(nil), s.shares.list...)
	s.shares.mu.Unlock()
	for _, sh := range list {
		if g, ok := had[sh.tag]; ok && g == sh.mount.Guest {
			continue
		}
		req := &agentproto.MountRequest{Tag: sh.tag, Path: sh.mount.Guest, ReadOnly: sh.mount.ReadOnly, VirtioFS: virtioFSTag}
		if err := s.guestMount(ctx, sh, req); err != nil {
			return err
		}
		s.vfs.MountedInGuest(sh.tag)
	}
	return nil
}
