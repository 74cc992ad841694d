// Package sandbox keeps the on-disk record of each sandbox (what it was
// created with, what state its supervisor last reported) and derives the
// truth from it: a sandbox whose supervisor no longer holds its lock is not
// running, whatever state.json says.
//
// One directory per sandbox under statedir.Dir.Sandboxes():
//
//	spec.json        written once by create
//	state.json       written at each transition (Change, over the table)
//	disk.qcow2       copy-on-write overlay over the image base
//	console.log      the guest's serial console
//	supervisor.log   the supervisor's own log
//	supervisor.lock  flock held by the live supervisor
//	crash.lock       taken by whoever records a dead supervisor's crash
//	reserve          space the supervisor frees when the host disk fills
//	sup.sock         the supervisor's API socket
//	qmp.sock         QEMU's monitor socket (the supervisor's)
//	qmp-operator.sock a second monitor for people and tools
//	profile.yaml     the security profile, resolved and frozen at create
//	usage.json       what model credentials have spent (internal/usage; the supervisor's)
//	suspend.state    memory and device state of a suspended sandbox
//	suspend.json     the QEMU, kernel and initramfs that state needs
package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/cache"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/statedir"
)

// Spec is what a sandbox was created with. It does not change afterwards,
// but for Template and Ports (each written by the supervisor).
type Spec struct {
	Name string `json:"name"`
	// ID is the sandbox's own identity, random, written once at create
	// (Manager.Create). A name is reused once its sandbox is removed, and
	// the log, which keeps the name, tells this sandbox's records from an
	// earlier one's by it (LogIdentity). Empty in sandboxes made before it
	// was kept.
	ID        string `json:"id,omitempty"`
	Image     string `json:"image"`
	ImageBase string `json:"image_base"` // qcow2 base file of the image
	// ImageDigest is the image's digest at create (empty in sandboxes
	// made before it was kept).
	ImageDigest string    `json:"image_digest,omitempty"`
	CPUs        int       `json:"cpus"`
	MemoryMiB   int       `json:"memory_mib"`
	DiskBytes   int64     `json:"disk_bytes"`
	Accel       string    `json:"accel,omitempty"` // "" = detect
	Env         []string  `json:"env,omitempty"`   // default env for every exec
	Created     time.Time `json:"created"`
	// Profile is the security profile as the user named it; its resolved
	// form is frozen into profile.yaml at create, so editing the file
	// later does not silently change a sandbox.
	Profile     string `json:"profile"`
	ProfileHash string `json:"profile_hash"`
	// Snapshot names the snapshot this sandbox was restored from: its
	// disk is backed by the snapshot's disk, so the snapshot cannot be
	// removed while this sandbox exists.
	Snapshot string `json:"snapshot,omitempty"`
	// Mounts are the host folders given with -v, in order (the
	// profile's files.mounts are added by the supervisor).
	Mounts []Mount `json:"mounts,omitempty"`
	// Caches are the named package caches the sandbox uses
	// (--volume-cache and the profile's files.caches), kept in the state
	// dir's caches/ beyond the sandbox (internal/cache).
	Caches []cache.Use `json:"caches,omitempty"`
	// Kernel is the guest kernel version the sandbox is pinned to (chosen
	// at create: the newest cached, or the snapshot's). A newer kernel
	// arriving with apt's lists never switches it; `smx kernel rm` refuses
	// while it is pinned. Empty when no kernel was cached at create (or in
	// sandboxes made before pinning): the supervisor then pins the newest
	// cached kernel at the next start.
	Kernel string `json:"kernel,omitempty"`
	// Template names the boot template the sandbox's first start was
	// restored from, instead of booting (set then by the supervisor, the
	// one change to a spec after create): its disk is backed by the
	// template's disk layer, which therefore stays while it exists.
	Template string `json:"template,omitempty"`
	// Ports are the guest ports published on the host (-p; `smx agent
	// port add|rm` changes them on a running sandbox through its
	// supervisor, which rewrites the spec). Each start binds them again.
	Ports []publish.Port `json:"ports,omitempty"`
	// Timeout stops the sandbox once a start has run this long
	// (--timeout); IdleStop stops it after this long without activity
	// (--idle-stop; the supervisor defines activity). Zero: no limit.
	Timeout  Duration `json:"timeout,omitempty"`
	IdleStop Duration `json:"idle_stop,omitempty"`
	// Worktree is the Git worktree the sandbox works in (--worktree), nil
	// when none: the supervisor narrows the profile to it
	// (policy.Profile.Worktree).
	Worktree *Worktree `json:"worktree,omitempty"`
}

// Worktree is a Git worktree of a host repository made for one sandbox.
type Worktree struct {
	Repo   string `json:"repo"`    // the host repository's top folder
	GitDir string `json:"git_dir"` // its .git, shared at the same path in the guest
	Path   string `json:"path"`    // the worktree's folder, the workspace
	Name   string `json:"name"`    // its name under GitDir/worktrees/
	Branch string `json:"branch"`  // agent/NAME
}

// CreateFields are the fields of the sandbox.create record that begins a
// sandbox's part of its log: written by `smx agent create`, or, for a
// sandbox created and started in one go (smx run), by its supervisor as
// the first record after it opens the log.
func (sp Spec) CreateFields() map[string]any {
	var mounts []string
	for _, m := range sp.Mounts {
		mounts = append(mounts, m.String())
	}
	f := map[string]any{
		"sandbox_id": sp.ID,
		"image":      sp.Image, "image_digest": sp.ImageDigest, "profile": sp.Profile, "profile_hash": sp.ProfileHash,
		"cpus": sp.CPUs, "memory_mib": sp.MemoryMiB, "disk_bytes": sp.DiskBytes, "mounts": mounts,
	}
	if len(sp.Ports) > 0 {
		var ports []string
		for _, p := range sp.Ports {
			ports = append(ports, p.String())
		}
		f["ports"] = ports
	}
	if sp.Timeout > 0 {
		f["timeout"] = sp.Timeout.String()
	}
	if sp.IdleStop > 0 {
		f["idle_stop"] = sp.IdleStop.String()
	}
	if len(sp.Caches) > 0 {
		var caches []string
		for _, c := range sp.Caches {
			caches = append(caches, c.String())
		}
		f["caches"] = caches
	}
	if sp.Worktree != nil {
		f["worktree"] = sp.Worktree.Path
		f["branch"] = sp.Worktree.Branch
	}
	return f
}

// NewID returns a new sandbox ID: 128 random bits in hex.
func NewID() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// LogIdentity selects this sandbox's own records in its log (audit.Identity):
// those from its sandbox.create on, not an earlier sandbox's of the same name.
func (sp Spec) LogIdentity() audit.Identity {
	return audit.Identity{ID: sp.ID, Created: sp.Created}
}

// WriteSpec replaces spec.json atomically.
func WriteSpec(p Paths, spec Spec) error {
	b, _ := json.MarshalIndent(spec, "", "  ")
	if err := statedir.WriteFileAtomic(p.Spec(), b, 0o600); err != nil {
		return fmt.Errorf("sandbox: write spec: %w", err)
	}
	return nil
}

// Status is where a sandbox is in its life.
type Status string

const (
	StatusCreated  Status = "created"  // never started
	StatusStarting Status = "starting" // supervisor booting the guest
	StatusRunning  Status = "running"
	StatusStopping Status = "stopping"
	StatusStopped  Status = "stopped"
	StatusCrashed  Status = "crashed" // QEMU or the supervisor died unasked
	StatusPaused   Status = "paused"  // vCPUs stopped, RAM kept; `smx agent resume` continues
	// StatusBlocked: QEMU stopped the guest on a host I/O error on its
	// disk (the host's disk is full); State.Error says where.
	// `smx agent resume` retries once space is freed.
	StatusBlocked Status = "blocked"
	// StatusSuspended: the guest's state is in suspend.state and no
	// process runs; `smx agent resume` restores it.
	StatusSuspended Status = "suspended"
)

// State is written by the supervisor; readers must go through Manager.Get,
// which corrects it when the supervisor died without writing.
type State struct {
	Status        Status    `json:"status"`
	SupervisorPID int       `json:"supervisor_pid,omitempty"`
	QEMUPID       int       `json:"qemu_pid,omitempty"`
	Accel         string    `json:"accel,omitempty"`
	AccelReason   string    `json:"accel_reason,omitempty"`
	Kernel        string    `json:"kernel,omitempty"`
	QEMUArgs      []string  `json:"qemu_args,omitempty"`
	Started       time.Time `json:"started,omitzero"`
	Stopped       time.Time `json:"stopped,omitzero"`
	BootMS        int64     `json:"boot_ms,omitempty"`
	// RestoredFrom says what this run loaded instead of booting: "suspend",
	// "snapshot NAME" or "template NAME".
	RestoredFrom string   `json:"restored_from,omitempty"`
	Error        string   `json:"error,omitempty"`
	ConsoleTail  []string `json:"console_tail,omitempty"`
	// StopReason says why the supervisor stopped the sandbox on its own,
	// e.g. "--timeout 10m0s reached"; empty for any other stop.
	StopReason string `json:"stop_reason,omitempty"`
}

// Info is a sandbox as the CLI shows it.
type Info struct {
	Spec  Spec   `json:"spec"`
	State State  `json:"state"`
	Dir   string `json:"dir"`
}

// Paths of one sandbox's files.
type Paths struct{ Dir string }

func (p Paths) Spec() string      { return filepath.Join(p.Dir, "spec.json") }
func (p Paths) State() string     { return filepath.Join(p.Dir, "state.json") }
func (p Paths) Disk() string      { return filepath.Join(p.Dir, "disk.qcow2") }
func (p Paths) Console() string   { return filepath.Join(p.Dir, "console.log") }
func (p Paths) Log() string       { return filepath.Join(p.Dir, "supervisor.log") }
func (p Paths) Lock() string      { return filepath.Join(p.Dir, "supervisor.lock") }
func (p Paths) Socket() string    { return filepath.Join(p.Dir, "sup.sock") }
func (p Paths) QMPSocket() string { return filepath.Join(p.Dir, "qmp.sock") }
func (p Paths) Profile() string   { return filepath.Join(p.Dir, "profile.yaml") }

// SuspendState holds a suspended guest's memory and device state;
// SuspendHost records the QEMU, kernel and initramfs it needs.
func (p Paths) SuspendState() string { return filepath.Join(p.Dir, "suspend.state") }
func (p Paths) SuspendHost() string  { return filepath.Join(p.Dir, "suspend.json") }

// The length is checked apart: a bounded repeat ({0,62}) compiles to a
// copy per count, which every smx process would pay for when it first
// checks a name.
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`) })

// ValidName reports whether name can name a sandbox.
func ValidName(name string) error {
	if len(name) > 63 || !nameRE().MatchString(name) {
		return fmt.Errorf("sandbox: invalid name %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalid)
	}
	return nil
}

// Manager finds and records sandboxes under a state directory.
type Manager struct{ State statedir.Dir }

// Paths returns the file layout of sandbox name.
func (m *Manager) Paths(name string) Paths {
	return Paths{Dir: filepath.Join(m.State.Sandboxes(), name)}
}

// LockAll serialises create and remove across CLIs.
func (m *Manager) LockAll() (*statedir.Lock, error) {
	if err := m.State.Ensure(); err != nil {
		return nil, err
	}
	return statedir.LockFile(filepath.Join(m.State.Sandboxes(), ".lock"))
}

// Create records a new sandbox and returns its paths. A spec without an
// ID gets a new one (NewID); callers that log the creation set it first. The caller holds
// LockAll and creates the disk afterwards; on failure it calls Remove.
//
// The files of also (the caller's: a profile, a disk) are written into the
// new directory at the same time as the spec and the state: the fsyncs of
// files written together share the filesystem's journal commits (four
// small files took 4-5 ms so, 10-14 ms one after another). A failure of
// any removes the directory.
func (m *Manager) Create(spec Spec, also ...func(Paths) error) (Paths, error) {
	if err := ValidName(spec.Name); err != nil {
		return Paths{}, err
	}
	if spec.ID == "" {
		spec.ID = NewID()
	}
	p := m.Paths(spec.Name)
	if err := os.Mkdir(p.Dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return Paths{}, fmt.Errorf("sandbox %s: %w: pick another --name or `smx agent rm %s`", spec.Name, errdefs.ErrExists, spec.Name)
		}
		return Paths{}, fmt.Errorf("sandbox: create: %w", err)
	}
	writes := append([]func(Paths) error{
		func(p Paths) error { return WriteSpec(p, spec) },
		func(p Paths) error { return WriteState(p, State{Status: StatusCreated}) },
	}, also...)
	errs := make([]error, len(writes))
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Go(func() { errs[i] = w(p) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		os.RemoveAll(p.Dir)
		return Paths{}, err
	}
	return p, nil
}

// WriteState replaces state.json atomically with st as it is. It is the
// writer under Change and Update, which are how smx moves a state (the
// table decides); elsewhere only tests use it, to set a sandbox up.
func WriteState(p Paths, st State) error {
	b, _ := json.MarshalIndent(st, "", "  ")
	if err := statedir.WriteFileAtomic(p.State(), b, 0o600); err != nil {
		return fmt.Errorf("sandbox: write state: %w", err)
	}
	return nil
}

// ReadSpec reads spec.json.
func ReadSpec(p Paths) (Spec, error) {
	var s Spec
	b, err := os.ReadFile(p.Spec())
	if err != nil {
		return s, err
	}
	err = json.Unmarshal(b, &s)
	return s, err
}

func readState(p Paths) (State, error) {
	var s State
	b, err := os.ReadFile(p.State())
	if err != nil {
		return s, err
	}
	err = json.Unmarshal(b, &s)
	return s, err
}

// LockedState is the state of a sandbox whose supervisor lock the caller
// holds (a supervisor about to start it): state.json's, created when
// there is none yet, and crashed when it says live, since the
// supervisor that wrote it is gone.
func LockedState(p Paths) (State, error) {
	st, err := readState(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return st, fmt.Errorf("sandbox: read state: %w", err)
	}
	if st.Status == "" {
		st.Status = StatusCreated
	}
	if st.Status.Live() {
		st, _ = Apply(st, EventCrashed)
	}
	return st, nil
}

// SupervisorAlive reports whether a supervisor holds the sandbox's lock.
func SupervisorAlive(p Paths) bool { return statedir.Held(p.Lock()) }

// Get returns the sandbox with its true status.
func (m *Manager) Get(name string) (*Info, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	p := m.Paths(name)
	// The state first: a sandbox whose directory is renamed away (removed)
	// between the two reads then has no spec, and is not found, instead of
	// reading as created for want of its state.
	st, err := readState(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sandbox %s: read state: %w", name, err)
	}
	if st.Status == "" {
		st.Status = StatusCreated
	}
	if afterStateRead != nil {
		afterStateRead()
	}
	spec, err := ReadSpec(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("sandbox %s: %w: `smx agent ls` lists sandboxes", name, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("sandbox %s: read spec: %w", name, err)
	}
	if st.Status.Live() && !SupervisorAlive(p) {
		// The supervisor may have ended between the read and the check: it
		// writes its last state before it lets go of its lock. A state
		// written since the read is the truth, not a crash.
		if cur, err := readState(p); err == nil && (cur.Status != st.Status || cur.SupervisorPID != st.SupervisorPID) {
			st = cur
		} else {
			dead := st
			st, _ = Apply(st, EventCrashed) // a live status can always crash
			if st.Error == "" {
				st.Error = "supervisor died"
			}
			if len(st.ConsoleTail) == 0 {
				st.ConsoleTail = ConsoleTail(p.Console(), 20)
			}
			m.recordCrash(name, p, dead, st)
		}
	}
	return &Info{Spec: spec, State: st, Dir: p.Dir}, nil
}

// afterStateRead, set by tests, runs in Get between the state's read and
// the spec's read and the check of its supervisor's lock.
var afterStateRead func()

// List returns every sandbox, sorted by name.
func (m *Manager) List() ([]Info, error) {
	ents, err := os.ReadDir(m.State.Sandboxes())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("sandbox: list: %w", err)
	}
	var out []Info
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		in, err := m.Get(e.Name())
		if err != nil {
			continue // half-created or removed under us
		}
		out = append(out, *in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Spec.Name < out[j].Spec.Name })
	return out, nil
}

// Remove deletes a sandbox's directory. The caller has made sure it is not
// running.
func (m *Manager) Remove(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	p := m.Paths(name)
	// Rename first so a concurrent Get sees either the whole sandbox or none.
	tomb := filepath.Join(m.State.Sandboxes(), fmt.Sprintf(".rm-%s-%d", name, time.Now().UnixNano()))
	if err := os.Rename(p.Dir, tomb); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sandbox %s: %w", name, errdefs.ErrNotFound)
		}
		return fmt.Errorf("sandbox %s: remove: %w", name, err)
	}
	return os.RemoveAll(tomb)
}

// ImagesInUse returns the names of images some sandbox is based on.
func (m *Manager) ImagesInUse() (map[string]bool, error) {
	list, err := m.List()
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, in := range list {
		used[in.Spec.Image] = true
	}
	return used, nil
}

// ConsoleTail returns the last n non-empty lines of the console log.
func ConsoleTail(path string, n int) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	const tailBytes = 16 << 10
	fi, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(fi.Size()-tailBytes, 0)
	buf := make([]byte, fi.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return nil
	}
	var lines []string
	for _, l := range strings.Split(string(buf), "\n") {
		l = strings.TrimRight(l, "\r")
		if strings.TrimSpace(l) != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return lines
}

// UpdateSpec rewrites spec.json through f (used when a sandbox's profile
// is changed). The caller holds Manager.LockAll.
func UpdateSpec(p Paths, f func(*Spec)) error {
	s, err := ReadSpec(p)
	if err != nil {
		return fmt.Errorf("sandbox: update spec: %w", err)
	}
	f(&s)
	b, _ := json.MarshalIndent(s, "", "  ")
	return statedir.WriteFileAtomic(p.Spec(), b, 0o600)
}
