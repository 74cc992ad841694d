package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/vm"
)

// Progress is told how many bytes a long save has written so far: every
// second, once the save has taken more than a second. It is called from
// another goroutine, never after the method it was given to returns.
type Progress func(written int64)

// goneTimeout bounds the wait for a supervisor to exit after it said it
// would (it only closes its log and sockets by then).
const goneTimeout = 30 * time.Second

// waitGone waits until sandbox name's supervisor has let go of its lock.
func (s *Service) waitGone(ctx context.Context, name string) error {
	p := s.manager().Paths(name)
	ctx, cancel := context.WithTimeout(ctx, goneTimeout)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for sandbox.SupervisorAlive(p) {
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return fmt.Errorf("sandbox %s: the supervisor did not exit within %s of saying it would; see %s: %w", name, goneTimeout, p.Log(), errdefs.ErrUnavailable)
			}
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// watch calls fn with path's size every second, once a second has
// passed, until the returned func is called (which waits for the last
// call to finish).
func watch(path string, fn Progress) func() {
	if fn == nil {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if fi, err := os.Stat(path); err == nil {
					fn(fi.Size())
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

// RunResult says how long a pause, resume, suspend or save took.
type RunResult struct {
	Name       string         `json:"name"`
	Status     sandbox.Status `json:"status"`
	Bytes      int64          `json:"bytes,omitempty"` // suspend: bytes of saved state
	DurationMS int64          `json:"duration_ms"`
}

// Pause stops a running sandbox's vCPUs; its memory stays in place and
// its supervisor keeps serving (profile changes, stop). Pausing a paused
// sandbox does nothing.
func (s *Service) Pause(ctx context.Context, name string) (*RunResult, error) {
	_, t, err := s.check(name, sandbox.OpPause)
	if err != nil {
		return nil, err
	}
	res := &RunResult{Name: name, Status: sandbox.StatusPaused}
	if t.NoOp {
		return res, nil
	}
	r, err := s.client(name).Pause(ctx)
	if err != nil {
		return nil, err
	}
	res.DurationMS = r.DurationMS
	return res, nil
}

// Resume continues a paused sandbox, retries a blocked one (the
// supervisor says so if the host disk is still full), or restores a
// suspended one with its processes (which takes a start). Resuming a
// running sandbox does nothing.
func (s *Service) Resume(ctx context.Context, name string) (*RunResult, error) {
	in, t, err := s.check(name, sandbox.OpResume)
	if err != nil {
		return nil, err
	}
	res := &RunResult{Name: name, Status: sandbox.StatusRunning}
	switch {
	case t.NoOp:
	case t.Supervisor:
		r, err := s.client(name).Resume(ctx)
		if err != nil {
			return nil, err
		}
		res.DurationMS = r.DurationMS
	case in.State.Status == sandbox.StatusSuspended:
		// The supervisor finds suspend.state and loads it.
		start := time.Now()
		if _, err := s.Start(ctx, StartRequest{Name: name}); err != nil {
			return nil, err
		}
		res.DurationMS = time.Since(start).Milliseconds()
	}
	return res, nil
}

// Suspend saves a running or paused sandbox's memory and processes to its
// directory and frees its RAM: QEMU and the supervisor exit (status
// suspended; Resume or Start restores it). It returns once the
// supervisor is gone. On failure the sandbox keeps running.
func (s *Service) Suspend(ctx context.Context, name string, progress Progress) (*RunResult, error) {
	if _, _, err := s.check(name, sandbox.OpSuspend); err != nil {
		return nil, err
	}
	p := s.manager().Paths(name)
	stop := watch(p.SuspendState()+".tmp", progress)
	r, err := s.client(name).Suspend(ctx)
	stop()
	if err != nil {
		return nil, err
	}
	if err := s.waitGone(ctx, name); err != nil {
		return nil, err
	}
	return &RunResult{Name: name, Status: sandbox.StatusSuspended, Bytes: r.Bytes, DurationMS: r.DurationMS}, nil
}

// SnapshotRequest asks for a snapshot of a running or paused sandbox.
type SnapshotRequest struct {
	Sandbox string `json:"sandbox"`
	Name    string `json:"name,omitempty"` // default SANDBOX-YYYYMMDD-HHMMSS
	// Stop stops the sandbox after the snapshot; otherwise it continues
	// (a paused one stays paused).
	Stop     bool     `json:"stop,omitempty"`
	Progress Progress `json:"-"`
}

// CreateSnapshot saves a sandbox's memory, devices, disk and profile as a
// snapshot, pausing the guest meanwhile; the snapshot is published whole
// or not at all. The supervisor logs it.
func (s *Service) CreateSnapshot(ctx context.Context, req SnapshotRequest) (*snapshot.Snapshot, error) {
	if _, _, err := s.check(req.Sandbox, sandbox.OpSnapshot); err != nil {
		return nil, err
	}
	if req.Name == "" {
		req.Name = req.Sandbox + "-" + time.Now().Format("20060102-150405")
	}
	if err := snapshot.ValidName(req.Name); err != nil {
		return nil, err
	}
	if _, err := s.snapshots().Get(req.Name); err == nil {
		return nil, fmt.Errorf("snapshot %s: %w: pick another --name", req.Name, errdefs.ErrExists)
	}
	stop := watch(filepath.Join(s.snapshots().TempDir(req.Name), "memory.state"), req.Progress)
	_, err := s.client(req.Sandbox).Snapshot(ctx, req.Name, req.Stop)
	stop()
	if err != nil {
		return nil, err
	}
	if req.Stop {
		if err := s.waitGone(ctx, req.Sandbox); err != nil {
			return nil, err
		}
	}
	return s.snapshots().Get(req.Name)
}

// ListSnapshots returns every snapshot, sorted by name.
func (s *Service) ListSnapshots(ctx context.Context) ([]snapshot.Snapshot, error) {
	list, err := s.snapshots().List()
	if list == nil {
		list = []snapshot.Snapshot{}
	}
	return list, err
}

// InspectSnapshot returns a snapshot's metadata; with verify it first
// checks the memory state and every disk layer against their digests
// (a mismatch is errdefs.ErrFailed naming the file).
func (s *Service) InspectSnapshot(ctx context.Context, name string, verify bool) (*snapshot.Snapshot, error) {
	sn, err := s.snapshots().Get(name)
	if err != nil {
		return nil, err
	}
	if verify {
		if err := s.snapshots().Verify(sn); err != nil {
			return nil, err
		}
	}
	return sn, nil
}

// RemoveSnapshots removes snapshots, each refused (errdefs.ErrInUse)
// while a sandbox restored from it exists; it returns the names removed
// and the errors of the others, joined. It holds the sandboxes lock, so
// no restore starts using a snapshot while it goes.
func (s *Service) RemoveSnapshots(ctx context.Context, names []string) ([]string, error) {
	m := s.manager()
	lock, err := m.LockAll()
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	inUse := func(snap string) ([]string, error) {
		list, err := m.List()
		if err != nil {
			return nil, err
		}
		var users []string
		for _, in := range list {
			if in.Spec.Snapshot == snap {
				users = append(users, "sandbox "+in.Spec.Name)
			}
		}
		return users, nil
	}
	var done []string
	var errs []error
	for _, n := range names {
		if err := s.snapshots().Remove(n, inUse); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, n)
	}
	return done, errors.Join(errs...)
}

// RestoreRequest forks a new sandbox from a snapshot.
type RestoreRequest struct {
	Snapshot string `json:"snapshot"`
	Name     string `json:"name"`              // the new sandbox
	Profile  string `json:"profile,omitempty"` // default: the snapshot's
	// Ports are published on the new sandbox (-p notation). A fork does
	// not publish its snapshot's ports (the source may still hold them)
	// unless KeepPorts says so; then Ports are added to them.
	Ports           []string `json:"ports,omitempty"`
	KeepPorts       bool     `json:"keep_ports,omitempty"`
	PublishExternal bool     `json:"publish_external,omitempty"`
	// Timeout and IdleStop replace the limits the fork inherits from its
	// snapshot's source (--timeout, --idle-stop): "" keeps them, "0"
	// removes one, a duration (10m) sets it.
	Timeout  string `json:"timeout,omitempty"`
	IdleStop string `json:"idle_stop,omitempty"`
	// Owner makes the new sandbox belong to the calling process, as
	// StartRequest.Owner does (the containerd shim's pods).
	Owner *os.File `json:"-"`
}

// forkLimit is a fork's limit: the snapshot's unless the restore sets one
// ("0" for none).
func forkLimit(flag, inherited, override string) (sandbox.Duration, error) {
	switch override {
	case "":
		return sandbox.ParseLimit(flag, inherited)
	case "0":
		return 0, nil
	}
	return sandbox.ParseLimit(flag, override)
}

// Restore creates sandbox Name from a snapshot and starts it: the guest
// continues where the snapshot was taken, on its own copy-on-write disk,
// with fresh entropy, the current time and its own hostname. Any number
// of sandboxes can be restored from one snapshot. The snapshot is checked
// against its digests and this host's QEMU first.
func (s *Service) Restore(ctx context.Context, req RestoreRequest) (*Sandbox, error) {
	if req.Name == "" {
		return nil, fmt.Errorf("restore needs --name for the new sandbox: %w", errdefs.ErrInvalid)
	}
	if err := sandbox.ValidName(req.Name); err != nil {
		return nil, err
	}
	store := s.snapshots()
	sn, err := store.Get(req.Snapshot)
	if err != nil {
		return nil, err
	}
	portSpecs := req.Ports
	if req.KeepPorts {
		portSpecs = append(slices.Clone(sn.Ports), req.Ports...)
	}
	ports, err := publish.ParsePorts(portSpecs, req.PublishExternal)
	if err != nil {
		return nil, err
	}
	timeout, err := forkLimit("--timeout", sn.Timeout, req.Timeout)
	if err != nil {
		return nil, err
	}
	idle, err := forkLimit("--idle-stop", sn.IdleStop, req.IdleStop)
	if err != nil {
		return nil, err
	}
	// Refuse early, with the reason, when this host cannot load the state;
	// the supervisor checks the kernel and initramfs again when it boots.
	if v, err := vm.QEMUVersionCached(ctx, "", filepath.Join(s.state.Root, "cache", "qemu-version")); err != nil {
		return nil, err
	} else if v != sn.QEMUVersion {
		return nil, fmt.Errorf("snapshot %s was saved by %q but this host runs %q: a saved state only restores on the same QEMU build: %w", sn.Name, sn.QEMUVersion, v, errdefs.ErrFailed)
	}
	// The state and every disk layer are checked against their digests:
	// a corrupt or altered snapshot is never loaded.
	if err := store.Verify(sn); err != nil {
		return nil, err
	}
	profName, profHash := sn.Profile, sn.ProfileHash
	profYAML, err := os.ReadFile(sn.ProfilePath())
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: profile: %w", sn.Name, err)
	}
	if req.Profile != "" {
		prof, err := s.ResolveProfile(req.Profile)
		if err != nil {
			return nil, fmt.Errorf("--profile: %w", err)
		}
		if profYAML, err = prof.FrozenYAML(); err != nil {
			return nil, err
		}
		profName, profHash = req.Profile, prof.Hash
	}

	// The fork mounts its source's host folders again (they must still
	// exist), deciding with its own profile.
	var mounts []sandbox.Mount
	for _, v := range sn.Mounts {
		mt, err := sandbox.ParseMount(v)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", sn.Name, err)
		}
		mounts = append(mounts, mt)
	}

	m := s.manager()
	lock, err := m.LockAll()
	if err != nil {
		return nil, err
	}
	id := sandbox.NewID()
	p, err := m.Create(sandbox.Spec{
		Name: req.Name, ID: id, Image: sn.Image, ImageBase: sn.ImageBase, Mounts: mounts,
		CPUs: sn.CPUs, MemoryMiB: sn.MemoryMiB, DiskBytes: sn.DiskBytes,
		Accel: sn.Accel, Env: sn.Env, Created: time.Now().UTC(),
		Profile: profName, ProfileHash: profHash, Snapshot: sn.Name, Kernel: sn.Kernel, Ports: ports,
		Timeout: timeout, IdleStop: idle,
		Worktree: sn.Worktree,
	})
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	err = statedir.WriteFileAtomic(p.Profile(), profYAML, 0o600)
	if err == nil {
		err = snapshot.ForkDisk(ctx, sn.DiskPath(), p.Disk())
	}
	if err != nil {
		m.Remove(req.Name)
		lock.Unlock()
		return nil, err
	}
	fields := map[string]any{
		"sandbox_id": id, "snapshot": sn.Name, "snapshot_source": sn.Source, "image": sn.Image, "image_digest": sn.ImageDigest,
		"profile": profName, "profile_hash": profHash,
		"cpus": sn.CPUs, "memory_mib": sn.MemoryMiB, "disk_bytes": sn.DiskBytes,
	}
	if len(ports) > 0 {
		var list []string
		for _, p := range ports {
			list = append(list, p.String())
		}
		fields["ports"] = list
	}
	if timeout > 0 {
		fields["timeout"] = timeout.String()
	}
	if idle > 0 {
		fields["idle_stop"] = idle.String()
	}
	if o := sn.Origin; o != nil {
		// A snapshot pulled from another host: the new log begins by
		// naming, by hash, the record of the source sandbox's log that
		// recorded the snapshot, so the two logs verify as one chain
		// across the move (`smx logs verify`).
		fields["origin_ref"], fields["origin_manifest"], fields["origin_signer"] = o.Ref, o.Manifest, o.Signer
		if h := o.LogHead; h != nil {
			fields["origin_log_sandbox"], fields["origin_log_id"], fields["origin_log_seq"], fields["origin_log_hash"] = h.Sandbox, h.LogID, h.Seq, h.Hash
		}
	}
	if profHash != sn.ProfileHash {
		fields["snapshot_profile"], fields["snapshot_profile_hash"] = sn.Profile, sn.ProfileHash
	}
	s.logEvent(ctx, req.Name, audit.KindSandboxCreate, fields)
	lock.Unlock()
	return s.Start(ctx, StartRequest{Name: req.Name, Owner: req.Owner})
}
