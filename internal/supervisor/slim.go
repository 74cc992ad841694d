package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/vm"
)

// A template's shared-RAM form (snapshot.Snapshot.SharedRAMPath). Its memory.state holds the guest's RAM in
// the migration stream, so a restore makes QEMU read all of it (and check
// every zero page, which on some host kernels makes all of guest RAM
// resident) before the guest runs. Once a template is saved, a second
// QEMU loads that state into RAM mapped shared from the template's `ram`
// file and saves it again with x-ignore-shared, which leaves the RAM out:
// `devices.state` then holds the devices alone (tens of KiB). A restore
// maps `ram` private and loads only the devices: the guest reads its
// pages from the host's page cache, one copy for every sandbox of the
// template, and a page it writes becomes its own. The conversion runs in
// the background of the start that saved the template (or of the first
// restore that finds it missing); restores use the stream form until it
// is there. `ram` stays writable by its owner because QEMU 7.2 opens a
// private file mapping read-write (it never writes it).

// slimOn is false with SMX_TEMPLATE_SHARED_RAM=0 in the supervisor's
// environment: templates are restored from the whole state and never
// converted (the benchmarks compare both forms that way).
func slimOn() bool { return os.Getenv("SMX_TEMPLATE_SHARED_RAM") != "0" }

// load waits for an incoming machine to load s.restore's state from uri
// and starts it: from a template's shared-RAM form, it asks for the load
// (the machine waits with Incoming "defer" for x-ignore-shared to be set)
// and turns x-ignore-shared off again before the guest runs, so later
// saves (snapshots, suspend) are whole states.
func (s *Supervisor) load(ctx context.Context, uri string) error {
	m := s.machine
	if s.restore.ramFile == "" {
		return m.WaitLoaded(ctx)
	}
	if err := m.LoadIgnoreShared(ctx, uri); err != nil {
		return err
	}
	if err := m.WaitPaused(ctx); err != nil {
		return err
	}
	if err := m.SetIgnoreShared(ctx, false); err != nil {
		return err
	}
	return m.Cont(ctx)
}

// slimTemplate converts template name to its shared-RAM form in the
// background; the process waits for it before it exits, whatever ends the
// sandbox (a throwaway sandbox's removal does not make anyone wait). A
// failure is logged: restores keep using the stream form.
func (s *Supervisor) slimTemplate(name string, cfg vm.Config) {
	if !slimOn() || s.vfs != nil {
		// A machine with the virtio-fs device needs its guest RAM as a
		// shared mapping of its own (the supervisor maps it too), which
		// a private mapping of the template's common file is not: its
		// templates stay whole states, loaded into a fresh memfd.
		return
	}
	s.slimming.Add(1)
	go func() {
		defer s.slimming.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		start := time.Now()
		t, err := s.templates().Get(name)
		if err == nil {
			err = convertTemplate(ctx, t, cfg, s.log)
		}
		if err != nil {
			s.log.Warn("template: shared-RAM form not made; restores load the whole state", "name", name, "err", err)
			return
		}
		s.log.Info("template: shared-RAM form made", "name", name, "ms", time.Since(start).Milliseconds())
	}()
}

// convertTemplate makes template t's shared-RAM form with a QEMU of the
// machine cfg describes (the one that saved t; the state only loads into
// an identical device list): its disk is a throwaway overlay on t's, its
// channels unconnected socket pairs, and it never runs the guest. Another
// process converting t at the same time makes this one return at once.
func convertTemplate(ctx context.Context, t *snapshot.Snapshot, cfg vm.Config, log *slog.Logger) error {
	ram, devices := t.SharedRAMPath(), t.DevicesStatePath()
	if t.HasSharedRAM() {
		return nil
	}
	lock, err := statedir.TryLock(filepath.Join(t.Dir, ".slim.lock"))
	if errors.Is(err, statedir.ErrLocked) {
		return nil
	}
	if err != nil {
		return err
	}
	defer lock.Unlock()
	if t.HasSharedRAM() {
		return nil // made while this process waited for the lock
	}
	if err := roomForRAM(filepath.Dir(ram), cfg.MemoryMiB); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "smx-slim-") // short: QMP's socket path
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)

	c := cfg
	c.Incoming, c.OperatorQMPSocket = "", ""
	c.QMPSocket = filepath.Join(work, "qmp.sock")
	c.ExtraFiles = make([]*os.File, len(cfg.ExtraFiles))
	c.Devices = make([]vm.Device, len(cfg.Devices))
	var hostEnds []*os.File
	defer func() {
		for _, f := range append(hostEnds, c.ExtraFiles...) {
			if f != nil {
				f.Close()
			}
		}
	}()
	pair := func(fd, typ int) error {
		i := fd - 3
		if i < 0 || i >= len(c.ExtraFiles) || c.ExtraFiles[i] != nil {
			return fmt.Errorf("device fd %d: %w", fd, errdefs.ErrInvalid)
		}
		fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		hostEnds = append(hostEnds, os.NewFile(uintptr(fds[0]), "slim-host"))
		c.ExtraFiles[i] = os.NewFile(uintptr(fds[1]), "slim-guest")
		return nil
	}
	for i, d := range cfg.Devices {
		switch d := d.(type) {
		case vm.Console:
			d.LogPath = filepath.Join(work, "console.log")
			c.Devices[i] = d
		case vm.Disk:
			d.Path = filepath.Join(work, "disk.qcow2")
			if err := forkDisk(t.DiskPath(), d.Path); err != nil {
				return err
			}
			c.Devices[i] = d
		case vm.SerialPort:
			if err := pair(d.FD, unix.SOCK_STREAM); err != nil {
				return err
			}
			c.Devices[i] = d
		case vm.NetDgram:
			if err := pair(d.FD, unix.SOCK_DGRAM); err != nil {
				return err
			}
			c.Devices[i] = d
		case vm.RNG:
			c.Devices[i] = d
		default:
			return fmt.Errorf("device %T: %w", d, errdefs.ErrUnavailable)
		}
	}
	for i, f := range c.ExtraFiles {
		if f == nil {
			return fmt.Errorf("fd %d: no device uses it: %w", 3+i, errdefs.ErrInvalid)
		}
	}
	state, err := os.Open(t.MemoryPath())
	if err != nil {
		return err
	}
	c.ExtraFiles = append(c.ExtraFiles, state)
	c.Incoming = fmt.Sprintf("fd:%d", 2+len(c.ExtraFiles))

	// Written under temporary names and renamed, the RAM first: a restore
	// uses the form only once both are there.
	ramTmp, devTmp := ram+".tmp", devices+".tmp"
	rf, err := os.OpenFile(ramTmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer rf.Close()
	defer os.Remove(ramTmp)
	if err := rf.Truncate(int64(cfg.MemoryMiB) << 20); err != nil {
		return err
	}
	c.RAMFile, c.RAMShared = ramTmp, true
	df, err := os.OpenFile(devTmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o444)
	if err != nil {
		return err
	}
	defer df.Close()
	defer os.Remove(devTmp)

	m, err := vm.Start(ctx, c, log)
	if err != nil {
		return err
	}
	defer m.Close()
	// It competes with the sandbox that saved the template for the CPU:
	// that one is what the user waits for.
	unix.Setpriority(unix.PRIO_PROCESS, m.PID(), 10)
	for _, f := range c.ExtraFiles {
		f.Close()
	}
	c.ExtraFiles = nil
	if err := m.WaitPaused(ctx); err != nil {
		return err
	}
	if err := m.SetIgnoreShared(ctx, true); err != nil {
		return err
	}
	if err := m.SaveState(ctx, df, nil); err != nil {
		return err
	}
	if err := m.Quit(ctx); err != nil {
		return err
	}
	if err := rf.Sync(); err != nil {
		return err
	}
	if err := df.Sync(); err != nil {
		return err
	}
	if err := os.Rename(ramTmp, ram); err != nil {
		return err
	}
	if err := os.Rename(devTmp, devices); err != nil {
		os.Remove(ram)
		return err
	}
	statedir.SyncDir(t.Dir)
	return nil
}

// slimReserve is the free space a shared-RAM conversion leaves on the
// state directory's file system beyond the guest's RAM: the form is an
// optimisation, and must never be what fills the disk that sandboxes
// write to.
const slimReserve = 512 << 20

// roomForRAM refuses a conversion unless dir's file system has room for
// a RAM file as large as the guest's memory (its upper bound: the file is
// sparse, the guest's non-zero pages only) plus slimReserve. A full file
// system would also make QEMU die of SIGBUS writing the mapped file.
func roomForRAM(dir string, memoryMiB int) error {
	if memoryMiB <= 0 {
		memoryMiB = 512
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("template: free space of %s: %w", dir, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	need := int64(memoryMiB)<<20 + slimReserve
	if free < need {
		return fmt.Errorf("template: %d MiB free in %s, the shared-RAM form needs %d MiB there (guest RAM and a reserve): %w",
			free>>20, dir, need>>20, errdefs.ErrUnavailable)
	}
	return nil
}
