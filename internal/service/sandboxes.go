package service

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/image"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/vm"
)

// Sandbox is a sandbox as ls, create, start and restore report it: its
// record without the QEMU command line (Inspect has it), with its uptime
// and how many requests its policy refused.
type Sandbox struct {
	sandbox.Info
	UptimeSeconds int64 `json:"uptime_seconds,omitempty"`
	// CPUSeconds and RSSBytes: HostUsage of a live sandbox.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	RSSBytes   int64   `json:"rss_bytes,omitempty"`
	Refusals   int64   `json:"refusals"`
	// Usage is what the guest spent through model credentials (UsageOf).
	Usage []CredentialUsage `json:"usage,omitempty"`
}

func (s *Service) summary(in sandbox.Info) Sandbox {
	in.State.QEMUArgs = nil
	n, _ := audit.CountRefusals(audit.Dir(s.state.Logs(), in.Spec.Name), in.Spec.LogIdentity())
	sb := Sandbox{Info: in, Refusals: n, Usage: UsageOf(in)}
	if up := Uptime(in); up > 0 {
		sb.UptimeSeconds = int64(up / time.Second)
		sb.CPUSeconds, sb.RSSBytes = HostUsage(in)
	}
	return sb
}

// HostUsage is what a live sandbox's QEMU process uses on the host: CPU time
// since it started (seconds) and resident memory (bytes); zeros when it
// cannot be read or the process is not that sandbox's QEMU any more.
func HostUsage(in sandbox.Info) (float64, int64) {
	pid := in.State.QEMUPID
	if pid <= 0 || Uptime(in) == 0 {
		return 0, 0
	}
	dir := fmt.Sprintf("/proc/%d/", pid)
	// A PID reused by another program reads as nothing.
	if comm, err := os.ReadFile(dir + "comm"); err != nil || !strings.HasPrefix(string(comm), "qemu") {
		return 0, 0
	}
	stat, err := os.ReadFile(dir + "stat")
	if err != nil {
		return 0, 0
	}
	// The fields after the command, which may hold spaces and ")".
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 22 {
		return 0, 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14 of proc(5)
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	rss, err3 := strconv.ParseInt(f[21], 10, 64)   // field 24, in pages
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0
	}
	const ticks = 100 // USER_HZ, fixed for /proc on Linux
	return float64(utime+stime) / ticks, rss * int64(os.Getpagesize())
}

// Uptime is how long a live sandbox has been up, 0 for one that is not.
func Uptime(in sandbox.Info) time.Duration {
	switch in.State.Status {
	case sandbox.StatusRunning, sandbox.StatusPaused, sandbox.StatusBlocked:
		if !in.State.Started.IsZero() {
			return time.Since(in.State.Started)
		}
	}
	return 0
}

// CreateRequest describes a new sandbox. Zero fields take the defaults.
type CreateRequest struct {
	Name    string `json:"name,omitempty"`    // default: generated, smx-XXXXXXXX
	Image   string `json:"image,omitempty"`   // default busybox
	Profile string `json:"profile,omitempty"` // built-in, name in profiles/, or file; default dev
	CPUs    int    `json:"cpus,omitempty"`    // 1 to 64; default 1
	Memory  string `json:"memory,omitempty"`  // e.g. 512M (the default), 2G
	// Disk is the root disk size (a copy-on-write overlay). Empty means
	// 4G, raised to the image's size; a size given is refused when
	// smaller than the image or larger than the host's free space.
	Disk  string   `json:"disk,omitempty"`
	Accel string   `json:"accel,omitempty"` // kvm or tcg; default: detect
	Env   []string `json:"env,omitempty"`   // KEY=VALUE for every command
	// Mounts are host folders in -v notation, HOST:GUEST[:ro,uid=N,gid=N]; HOST
	// relative to the caller's working directory.
	Mounts []string `json:"mounts,omitempty"`
	// Ports are guest ports to publish on the host in -p notation,
	// [HOSTIP:]HOSTPORT:GUESTPORT[/tcp] (HOSTIP 127.0.0.1 unless given,
	// HOSTPORT 0 for a free one); PublishExternal allows a HOSTIP that
	// is not a loopback address.
	Ports           []string `json:"ports,omitempty"`
	PublishExternal bool     `json:"publish_external,omitempty"`
	// Timeout and IdleStop are the sandbox's limits as Go durations
	// (10m, 1h30m; at least 1s; empty: none): its supervisor stops it
	// once a start has run Timeout, or after IdleStop without activity.
	Timeout  string `json:"timeout,omitempty"`
	IdleStop string `json:"idle_stop,omitempty"`
	// Worktree, when set, gives the sandbox its own Git worktree of the
	// repository at WorktreeRepo (default: the caller's working
	// directory) on branch agent/NAME, made under WorktreeDir (default:
	// the state dir) or reused, and mounted at /work (see worktree.go).
	Worktree     string `json:"worktree,omitempty"`
	WorktreeRepo string `json:"worktree_repo,omitempty"`
	WorktreeDir  string `json:"worktree_dir,omitempty"`
	// Caches are named package caches that outlive the sandbox, in
	// --volume-cache notation NAME[:GUESTPATH][:ro|shared] (see
	// internal/cache; NAME alone for npm, pip, go and cargo), after the
	// profile's files.caches; ~ is the guest user's home.
	Caches []string `json:"caches,omitempty"`
	// worktree is the one RunAgent prepared and mounted itself.
	worktree *sandbox.Worktree
	// cacheOwner is the guest user the caches belong to (RunAgent's
	// preset user); root when nil.
	cacheOwner *cacheOwner
}

// cacheOwner is the guest user whose home holds the caches.
type cacheOwner struct {
	Home     string
	UID, GID uint32
}

// Create records a sandbox and its disk, in status created (it does not
// boot it). It undoes itself on failure. Two Creates of one name race
// safely: one gets errdefs.ErrExists.
func (s *Service) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	in, err := s.create(ctx, req, true)
	if err != nil {
		return nil, err
	}
	sb := s.summary(*in)
	return &sb, nil
}

// create is Create; with logNow false it leaves the sandbox.create record
// to the sandbox's first supervisor (Launch: StartRequest.LogCreate).
func (s *Service) create(ctx context.Context, req CreateRequest, logNow bool) (*sandbox.Info, error) {
	if req.Name == "" {
		b := make([]byte, 4)
		rand.Read(b)
		req.Name = "smx-" + hex.EncodeToString(b)
	}
	if req.Image == "" {
		req.Image = "busybox"
	}
	if req.Profile == "" {
		req.Profile = "dev"
	}
	if req.CPUs == 0 {
		req.CPUs = 1
	}
	if req.Memory == "" {
		req.Memory = "512M"
	}
	if err := sandbox.ValidName(req.Name); err != nil {
		return nil, err
	}
	timeout, err := sandbox.ParseLimit("--timeout", req.Timeout)
	if err != nil {
		return nil, err
	}
	idle, err := sandbox.ParseLimit("--idle-stop", req.IdleStop)
	if err != nil {
		return nil, err
	}
	if req.CPUs < 1 || req.CPUs > 64 {
		return nil, fmt.Errorf("invalid --cpus %d: use 1 to 64: %w", req.CPUs, errdefs.ErrInvalid)
	}
	mem, err := ParseSize(req.Memory)
	if err != nil {
		return nil, fmt.Errorf("--memory: %w", err)
	}
	if mem < 64<<20 || mem > 1<<40 {
		return nil, fmt.Errorf("invalid --memory %s: use 64M to 1T: %w", req.Memory, errdefs.ErrInvalid)
	}
	if err := checkMemory(req.Memory, mem); err != nil {
		return nil, err
	}
	var disk int64 = 4 << 30
	if req.Disk != "" {
		if disk, err = ParseSize(req.Disk); err != nil {
			return nil, fmt.Errorf("--disk: %w", err)
		}
	}
	switch req.Accel {
	case "", "kvm", "tcg":
	default:
		return nil, fmt.Errorf("invalid --accel %q: use kvm or tcg: %w", req.Accel, errdefs.ErrInvalid)
	}
	env, err := ParseEnv(req.Env)
	if err != nil {
		return nil, err
	}
	prof, err := s.ResolveProfile(req.Profile)
	if err != nil {
		return nil, fmt.Errorf("--profile: %w", err)
	}
	wt := req.worktree
	if wt == nil && req.Worktree != "" {
		repo := req.WorktreeRepo
		if repo == "" {
			repo = "."
		}
		if wt, err = s.prepareWorktree(ctx, repo, req.Worktree, req.WorktreeDir); err != nil {
			return nil, err
		}
		req.Mounts = append([]string{wt.Path + ":/work", wt.GitDir + ":" + wt.GitDir}, req.Mounts...)
	}
	mounts, err := parseMounts(req.Mounts, prof)
	if err != nil {
		return nil, err
	}
	caches, err := s.parseCaches(req.Caches, req.cacheOwner, prof, mounts)
	if err != nil {
		return nil, err
	}
	ports, err := publish.ParsePorts(req.Ports, req.PublishExternal)
	if err != nil {
		return nil, err
	}
	profYAML, err := prof.FrozenYAML()
	if err != nil {
		return nil, err
	}
	img, err := s.images().Get(req.Image)
	if err != nil {
		return nil, err
	}
	if disk, err = s.checkDisk(req.Disk, disk, img); err != nil {
		return nil, err
	}
	m := s.manager()
	lock, err := m.LockAll()
	if err != nil {
		return nil, err
	}
	defer func() { lock.Unlock() }() // lock may be taken again below
	// Pinned to the newest cached kernel; with none cached yet, the first
	// start pins the one `smx setup` brings.
	var kernelVersion string
	if k, err := kernel.Find(s.state.Kernels()); err == nil {
		kernelVersion = k.Version
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	spec := sandbox.Spec{
		Name: req.Name, ID: sandbox.NewID(), Image: img.Name, ImageBase: img.Path, ImageDigest: img.Digest, Kernel: kernelVersion,
		CPUs: req.CPUs, MemoryMiB: int(mem >> 20), DiskBytes: disk,
		Accel: req.Accel, Env: env, Created: time.Now().UTC(),
		Profile: req.Profile, ProfileHash: prof.Hash, Mounts: mounts, Ports: ports, Caches: caches,
		Timeout: timeout, IdleStop: idle, Worktree: wt,
	}
	// The profile's frozen copy and the disk overlay (written directly
	// rather than by qemu-img: a process start less on the way to `smx
	// run`'s first exec) are written with the spec and the state.
	base, err := filepath.Abs(img.Path)
	if err != nil {
		return nil, err
	}
	files := []func(sandbox.Paths) error{
		func(p sandbox.Paths) error { return statedir.WriteFileAtomic(p.Profile(), profYAML, 0o600) },
		func(p sandbox.Paths) error { return vm.CreateOverlay(p.Disk(), base, disk) },
	}
	_, err = m.Create(spec, files...)
	if errors.Is(err, errdefs.ErrExists) {
		// A `smx run` of that name that just ended may still be removing
		// its sandbox.
		lock.Unlock()
		s.awaitDiscard(ctx, req.Name)
		if lock, err = m.LockAll(); err != nil {
			return nil, err
		}
		_, err = m.Create(spec, files...)
	}
	if err != nil {
		return nil, err
	}
	if logNow {
		s.logEvent(ctx, req.Name, audit.KindSandboxCreate, spec.CreateFields())
	}
	return m.Get(req.Name)
}

// checkDisk validates a root disk size against what the image and the host
// can give. The disk is a sparse copy-on-write overlay, but the guest grows
// its filesystem to the size asked for: smaller than the image cannot hold
// it, and larger than the host's free space promises room that is not
// there (at 100T the guest's resize even overflowed). The default size is
// raised to the image's when the image is larger.
func (s *Service) checkDisk(flag string, disk int64, img *image.Image) (int64, error) {
	given := flag != ""
	if disk < img.Size {
		if !given {
			return img.Size, nil
		}
		return 0, fmt.Errorf("invalid --disk %s: image %s needs at least %s: %w", flag, img.Name, HumanBytes(img.Size), errdefs.ErrInvalid)
	}
	if !given {
		return disk, nil
	}
	if err := s.state.Ensure(); err != nil {
		return 0, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.state.Root, &st); err == nil {
		if free := int64(st.Bavail) * st.Bsize; disk > free {
			return 0, fmt.Errorf("invalid --disk %s: only %s is free under %s: %w", flag, HumanBytes(free), s.state.Root, errdefs.ErrInvalid)
		}
	}
	return disk, nil
}

// checkMemory refuses guest memory larger than the host's RAM: QEMU would
// fail to allocate it at start ("cannot set up guest memory"), or the host
// would swap itself to a halt.
func checkMemory(flag string, mem int64) error {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return nil
	}
	if total := int64(si.Totalram) * int64(si.Unit); total > 0 && mem > total {
		return fmt.Errorf("invalid --memory %s: the host has %s of RAM: %w", flag, HumanBytes(total), errdefs.ErrInvalid)
	}
	return nil
}

// parseMounts reads -v values and checks them against each other and
// against the profile's own files.mounts.
func parseMounts(flags []string, prof *policy.Profile) ([]sandbox.Mount, error) {
	var out []sandbox.Mount
	for _, v := range flags {
		m, err := sandbox.ParseMount(v)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if err := sandbox.CheckMounts(out); err != nil {
		return nil, err
	}
	for _, m := range out {
		for _, pm := range prof.Files.Mounts {
			if pm.Guest == m.Guest {
				return nil, fmt.Errorf("-v %s: the profile already mounts %s at %s (%s): %w", m, pm.Host, pm.Guest, pm.Pos, errdefs.ErrInvalid)
			}
		}
	}
	return out, nil
}

// StartRequest names a sandbox to boot.
type StartRequest struct {
	Name string `json:"name"`
	// Cold boots the guest even when a boot template could be restored.
	Cold bool `json:"cold,omitempty"`
	// Owner, when set, makes the sandbox belong to the calling process:
	// the read end of a pipe whose write end only the caller holds, for
	// as long as it lives. When the caller dies in any way the supervisor
	// stops and removes the sandbox (`smx run`). Start closes nothing;
	// the caller closes Owner once Start returns.
	Owner *os.File `json:"-"`
	// LogCreate makes the supervisor write the sandbox.create record (see
	// Spec.CreateFields) as it opens the log, for a sandbox created
	// without it: one log writer from create to removal, and the
	// create's own open, append and close of the log (a third of its
	// time) off the start path.
	LogCreate bool `json:"-"`
	// parked, when set, is the supervisor Launch started before the
	// sandbox existed: Start hands it the sandbox (argv and owner were
	// given to it then).
	parked *sandbox.Parked
	// noServices leaves the agent's services to the caller (RunAgent
	// starts them once the preset's files are in place).
	noServices bool
}

// Start boots a created, stopped, crashed or suspended sandbox (a
// suspended one continues where it was) and returns once its guest
// agent answers: status running. Its supervisor runs detached, so the
// sandbox outlives the caller (unless Owner is set). Cancelling ctx
// during the boot stops the supervisor. Starting a live sandbox fails
// with errdefs.ErrExists.
func (s *Service) Start(ctx context.Context, req StartRequest) (*Sandbox, error) {
	if _, _, err := s.check(req.Name, sandbox.OpStart); err != nil {
		if req.parked != nil {
			req.parked.Cancel()
		}
		return nil, err
	}
	var in *sandbox.Info
	var err error
	if req.parked != nil {
		in, err = req.parked.Start(ctx, req.Name)
	} else {
		var argv []string
		if argv, err = s.supervisorArgv(req.Name, req.Cold, req.LogCreate); err != nil {
			return nil, err
		}
		in, err = s.manager().StartOwned(ctx, req.Name, argv, req.Owner)
	}
	// The accelerator and why are said by doctor, setup and inspect; a
	// command's own stderr stays the command's.
	if err != nil && in != nil && len(in.State.ConsoleTail) > 0 {
		err = fmt.Errorf("%w\nlast console lines:\n  %s", err, strings.Join(in.State.ConsoleTail, "\n  "))
	}
	if err != nil {
		return nil, err
	}
	if !req.noServices {
		if err := s.restartServices(ctx, req.Name, in.State.RestoredFrom); err != nil {
			return nil, fmt.Errorf("sandbox %s is running, but %w", req.Name, err)
		}
	}
	sb := s.summary(*in)
	return &sb, nil
}

// StopRequest names a sandbox to power off.
type StopRequest struct {
	Name string `json:"name"`
	// Timeout is how long the guest gets to power off before QEMU is
	// told to quit, then killed (default 30s).
	Timeout time.Duration `json:"timeout,omitempty"`
}

// Stop powers a sandbox off: guest shutdown, then QEMU quit, then kill,
// within Timeout; it returns once the supervisor is gone (status
// stopped). A suspended sandbox's saved state is dropped. A sandbox
// that is not running is left as it is (no error).
func (s *Service) Stop(ctx context.Context, req StopRequest) (*Sandbox, error) {
	if req.Timeout <= 0 {
		req.Timeout = 30 * time.Second
	}
	if _, _, err := s.check(req.Name, sandbox.OpStop); err != nil {
		return nil, err
	}
	if err := s.manager().Stop(ctx, req.Name, req.Timeout); err != nil {
		return nil, err
	}
	in, err := s.manager().Get(req.Name)
	if err != nil {
		return nil, err
	}
	sb := s.summary(*in)
	return &sb, nil
}

// RemoveRequest names a sandbox to delete.
type RemoveRequest struct {
	Name string `json:"name"`
	// Force stops a live sandbox first; without it a live sandbox is
	// refused with errdefs.ErrInUse.
	Force bool `json:"force,omitempty"`
}

// Remove deletes a sandbox: its record, disk and sockets. Its log stays
// (until `smx logs prune`), ending with sandbox.remove. Removing holds
// the sandboxes lock, so no create, restore or snapshot rm interleaves.
func (s *Service) Remove(ctx context.Context, req RemoveRequest) error {
	op := sandbox.OpRemove
	if req.Force {
		op = sandbox.OpForceRemove
	}
	m := s.manager()
	s.awaitDiscard(ctx, req.Name)
	_, t, err := s.check(req.Name, op)
	if err != nil {
		return err
	}
	// A supervisor may still be on its way out of a status the table
	// calls stopped: it is live until it lets go of its lock.
	if alive := sandbox.SupervisorAlive(m.Paths(req.Name)); t.Supervisor || alive {
		if !req.Force {
			st := sandbox.StatusRunning
			if in, err := m.Get(req.Name); err == nil {
				st = in.State.Status
			}
			return fmt.Errorf("sandbox %s is %s: stop it first or use `smx agent rm -f %s`: %w", req.Name, st, req.Name, errdefs.ErrInUse)
		}
		if err := m.Stop(ctx, req.Name, 10*time.Second); err != nil {
			return err
		}
	}
	lock, err := m.LockAll()
	if err != nil {
		return err
	}
	defer lock.Unlock()
	in, err := m.Get(req.Name)
	if err != nil {
		return err
	}
	// Checked again under the lock: a start may have won the race.
	if _, err := sandbox.Check(in, sandbox.OpRemove); err != nil {
		return err
	}
	status := in.State.Status
	if status != sandbox.StatusRemoving {
		if _, err := sandbox.Change(m.Paths(req.Name), in.State, sandbox.EventRemoving, nil); err != nil {
			return fmt.Errorf("sandbox %s: rm: %w", req.Name, err)
		}
	}
	if err := m.Remove(req.Name); err != nil {
		return err
	}
	fields := map[string]any{"status": string(status)}
	if status == sandbox.StatusCrashed {
		fields["error"] = in.State.Error
	}
	s.logEvent(ctx, req.Name, audit.KindSandboxRemove, fields)
	return nil
}

// List returns every sandbox, sorted by name, each with its true status
// (a live status whose supervisor died reads crashed, and the crash is
// logged once).
func (s *Service) List(ctx context.Context) ([]Sandbox, error) {
	list, err := s.manager().List()
	if err != nil {
		return nil, err
	}
	out := []Sandbox{}
	for _, in := range list {
		if discarding(s.manager(), in) {
			continue // a `smx run` that ended: its supervisor is removing it
		}
		out = append(out, s.summary(in))
	}
	return out, nil
}

// discarding reports whether a sandbox is being removed by its own
// supervisor (supproto.OpDiscard: a `smx run` that ended). Its CLI has
// exited already; to everyone else it is gone, or about to be. A
// removing sandbox without a live supervisor is a removal that was cut
// short: listed, and finished by `rm -f`. in was read before this check,
// so the supervisor may have finished in between: it renames the
// directory away before it lets go of its lock, and a directory gone is
// a removal done, not cut short.
func discarding(m *sandbox.Manager, in sandbox.Info) bool {
	if in.State.Status != sandbox.StatusRemoving {
		return false
	}
	p := m.Paths(in.Spec.Name)
	if sandbox.SupervisorAlive(p) {
		return true
	}
	_, err := os.Stat(p.Dir)
	return errors.Is(err, fs.ErrNotExist)
}

// awaitDiscards waits (up to 10 s each, or until ctx ends) for every
// sandbox being removed by its own supervisor, so that removing what a
// `smx run` used (its image, template or kernel) right after it exited
// is not refused for a sandbox that is already on its way out.
func (s *Service) awaitDiscards(ctx context.Context) {
	m := s.manager()
	list, err := m.List()
	if err != nil {
		return
	}
	for _, in := range list {
		if discarding(m, in) {
			s.awaitDiscard(ctx, in.Spec.Name)
		}
	}
}

// awaitDiscard waits (up to 10 s, or until ctx ends) while sandbox name
// is being removed by its own supervisor, so that an operation right
// after a `smx run` finds it gone and its log complete (sandbox.remove
// and the final signed checkpoint).
func (s *Service) awaitDiscard(ctx context.Context, name string) {
	m := s.manager()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		in, err := m.Get(name)
		if err != nil || !discarding(m, *in) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Inspect returns one sandbox's full record, QEMU command line included.
func (s *Service) Inspect(ctx context.Context, name string) (*sandbox.Info, error) {
	return s.manager().Get(name)
}

// PolicyRequest changes a sandbox's security profile.
type PolicyRequest struct {
	Name    string `json:"name"`
	Profile string `json:"profile"` // built-in, name in profiles/, or file
}

// PolicyResult says what a profile change did.
type PolicyResult struct {
	Name    string `json:"name"`
	Profile string `json:"profile"`
	Hash    string `json:"hash"`
	// Applied: the sandbox's supervisor applied it at once (running,
	// paused or blocked sandboxes); otherwise it applies from the next
	// start.
	Applied bool `json:"applied"`
	// ClosedFlows counts the live flows the new profile no longer allows.
	ClosedFlows int `json:"closed_flows"`
}

// SetPolicy resolves a profile, freezes it into the sandbox and, when the
// sandbox has a supervisor, has it apply the profile to new and live
// flows and log the change (it owns the log); otherwise the change is
// logged here. A paused sandbox is told too, so after resume it enforces
// the new profile. Refused (errdefs.ErrFailed) while the sandbox starts
// or stops, when nobody could reliably be told.
func (s *Service) SetPolicy(ctx context.Context, req PolicyRequest) (*PolicyResult, error) {
	m := s.manager()
	in, t, err := s.check(req.Name, sandbox.OpPolicy)
	if err != nil {
		return nil, err
	}
	prof, err := s.ResolveProfile(req.Profile)
	if err != nil {
		return nil, err
	}
	y, err := prof.FrozenYAML()
	if err != nil {
		return nil, err
	}
	lock, err := m.LockAll()
	if err != nil {
		return nil, err
	}
	p := m.Paths(req.Name)
	err = statedir.WriteFileAtomic(p.Profile(), y, 0o600)
	if err == nil {
		err = sandbox.UpdateSpec(p, func(sp *sandbox.Spec) { sp.Profile, sp.ProfileHash = req.Profile, prof.Hash })
	}
	lock.Unlock()
	if err != nil {
		return nil, err
	}
	res := &PolicyResult{Name: req.Name, Profile: req.Profile, Hash: prof.Hash}
	if t.Supervisor {
		n, err := s.client(req.Name).SetProfile(ctx)
		if err != nil {
			return nil, err
		}
		res.Applied, res.ClosedFlows = true, n
		return res, nil
	}
	s.logEvent(ctx, req.Name, audit.KindProfileChange, map[string]any{
		"old_hash": in.Spec.ProfileHash, "new_hash": prof.Hash, "profile": req.Profile,
	})
	return res, nil
}

// LaunchRequest creates and boots a sandbox in one go (`smx run`).
type LaunchRequest struct {
	CreateRequest
	Cold bool `json:"cold,omitempty"`
	// Keep makes the sandbox outlive the caller like any other;
	// otherwise it belongs to the calling process.
	Keep bool `json:"keep,omitempty"`
}

// Launch creates a sandbox and boots it. Unless Keep, the sandbox belongs
// to this process: its supervisor stops and removes it when this process
// dies in any way, SIGKILL included (it holds the read end of a pipe
// whose write end only this process has), and a boot that fails or is
// cancelled through ctx removes it before Launch returns.
//
// release stops and removes a sandbox that is not kept, at once (a
// throwaway sandbox needs no clean guest shutdown: its disk goes next),
// and does nothing for a kept one; it is never nil and is idempotent.
func (s *Service) Launch(ctx context.Context, req LaunchRequest) (sb *Sandbox, release func() error, err error) {
	release = func() error { return nil }
	// The owner pipe and the supervisor come first: the supervisor's
	// process start runs while the sandbox is created.
	var owner, ownerW *os.File
	if !req.Keep {
		if owner, ownerW, err = os.Pipe(); err != nil {
			return nil, release, err
		}
		defer owner.Close() // the supervisor has its own copy
	}
	var parked *sandbox.Parked
	if argv, err := s.supervisorArgv("", req.Cold, true); err == nil {
		// Without one, Start starts a supervisor as for any sandbox.
		if parked, err = s.manager().Park(argv, owner); err != nil {
			s.log.Debug("park supervisor", "err", err)
		}
	}
	created, err := s.create(ctx, req.CreateRequest, false)
	if err != nil {
		if parked != nil {
			parked.Cancel()
		}
		if ownerW != nil {
			ownerW.Close()
		}
		return nil, release, err
	}
	name := created.Spec.Name
	if !req.Keep {
		var once sync.Once
		var rerr error
		release = func() error {
			once.Do(func() {
				// The write end stays open until the sandbox is gone (or
				// its supervisor has taken over the removal), so the
				// supervisor does not remove it under this removal.
				defer ownerW.Close()
				bg := context.WithoutCancel(ctx)
				// The supervisor finishes the teardown after answering
				// (the sandbox reads removing meanwhile): the caller need
				// not wait for it.
				wait := 10 * time.Second
				if len(created.Spec.Caches) > 0 {
					wait += 2 * time.Minute // the supervisor's promotion of read-only caches first
				}
				dctx, cancel := context.WithTimeout(bg, wait)
				err := s.client(name).Discard(dctx)
				cancel()
				if err == nil {
					return
				}
				s.log.Debug("discard", "sandbox", name, "err", err)
				s.Stop(bg, StopRequest{Name: name, Timeout: time.Millisecond})
				if err := s.Remove(bg, RemoveRequest{Name: name, Force: true}); err != nil {
					rerr = fmt.Errorf("removing sandbox %s: %w", name, err)
				}
			})
			return rerr
		}
	}
	sb, err = s.Start(ctx, StartRequest{Name: name, Cold: req.Cold, Owner: owner, LogCreate: true, parked: parked})
	if err != nil {
		s.ensureCreateLogged(ctx, created.Spec)
		if rerr := release(); rerr != nil {
			s.warn("%v", rerr)
		}
		return nil, func() error { return nil }, err
	}
	return sb, release, nil
}

// ensureCreateLogged writes spec's sandbox.create record when the log has
// none since spec's sandbox was created: its supervisor, which was to
// write it, failed before it opened the log.
func (s *Service) ensureCreateLogged(ctx context.Context, spec sandbox.Spec) {
	found := errors.New("found")
	err := audit.Scan(audit.Dir(s.state.Logs(), spec.Name), audit.Filter{Since: spec.Created}, func(r audit.Record) error {
		if r.Kind == audit.KindSandboxCreate {
			return found
		}
		return nil
	})
	if !errors.Is(err, found) {
		s.logEvent(ctx, spec.Name, audit.KindSandboxCreate, spec.CreateFields())
	}
}
