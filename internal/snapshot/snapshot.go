// Package snapshot stores sandbox snapshots: a running guest's memory and
// device state together with its disk, captured at one instant, from which
// any number of sandboxes can be restored (forked).
//
// On disk a store is a directory of snapshot directories:
//
//	DIR/.lock                 flock(2) around every change of the set of snapshots
//	DIR/NAME/snapshot.json    metadata (Snapshot), with content digests
//	DIR/NAME/memory.state     QEMU migration stream: RAM and device state
//	DIR/NAME/disk.qcow2       the sandbox's disk overlay (read-only from now on);
//	                          its backing file is the image base or a parent snapshot's disk
//	DIR/NAME/profile.yaml     the sandbox's frozen security profile
//	DIR/.tmp-NAME/            a save in progress (or one that crashed)
//
// A snapshot is written in a .tmp- directory and renamed into place only
// when complete, so a save that fails (disk full, QEMU killed) never
// leaves a half snapshot where List or Get can see it. The saver holds an
// flock on the temporary directory; one nobody holds is stale and removed.
package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/smx-dev/smx/internal/sandbox"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/vm"
)

const (
	metaFile    = "snapshot.json"
	memoryFile  = "memory.state"
	diskFile    = "disk.qcow2"
	profileFile = "profile.yaml"

	sharedRAMFile    = "ram"
	devicesStateFile = "devices.state"
	tmpPrefix        = ".tmp-"
)

// Host is what a saved state depends on besides its own files: the QEMU
// build that wrote it (migration streams are only loaded by the same
// build), the guest kernel and the initramfs it booted, the accelerator,
// and the virtual CPU its guest ran on. A state is restored only where all
// of them match.
type Host struct {
	QEMUVersion   string `json:"qemu_version"`
	Kernel        string `json:"kernel"`
	InitramfsHash string `json:"initramfs_hash"`
	Accel         string `json:"accel"`
	// VirtioFS: the machine had the virtio-fs device (its mounts' state
	// is in the saved state); a restore must declare the same device.
	VirtioFS bool `json:"virtiofs,omitempty"`
	// Machine is the QEMU machine type (microvm, which has no versions of
	// its own: the QEMU build pins it), CPU the -cpu model. Under TCG the
	// model and the QEMU build fix what the guest sees; under KVM (-cpu
	// host) the guest sees the host's CPU, so CPUFlags records the host's
	// feature flags and a restore needs every one of them (a guest that
	// found AVX-512 at boot crashes on a CPU without it). Empty in states
	// saved before they were recorded: then not checked.
	Machine  string   `json:"machine,omitempty"`
	CPU      string   `json:"cpu,omitempty"`
	CPUFlags []string `json:"cpu_flags,omitempty"`
	// Firmware is the ROM the machine ran (vm.Config.Firmware): a restore
	// starts the same one. Empty in states saved before smx chose one:
	// QEMU's default then (vm.FirmwareSeaBIOS).
	Firmware string `json:"firmware,omitempty"`
}

// Check explains the first difference between the host a state was saved
// on (h) and the current one, as an ErrFailed error, or returns nil.
func (h Host) Check(cur Host) error {
	diff := func(what, was, now string) error {
		return fmt.Errorf("snapshot: saved with %s %q, this host has %q: a saved state only restores on the same build: %w", what, was, now, errdefs.ErrFailed)
	}
	switch {
	case h.QEMUVersion != cur.QEMUVersion:
		return diff("QEMU", h.QEMUVersion, cur.QEMUVersion)
	case h.Kernel != cur.Kernel:
		return diff("guest kernel", h.Kernel, cur.Kernel)
	case h.InitramfsHash != cur.InitramfsHash:
		return diff("initramfs (smx-agent and modules)", h.InitramfsHash, cur.InitramfsHash)
	case h.Accel != cur.Accel:
		return diff("accelerator", h.Accel, cur.Accel)
	}
	if m := h.MissingCPU(cur); len(m) > 0 {
		return fmt.Errorf("snapshot: this host lacks %s: %w", strings.Join(m, " and "), errdefs.ErrFailed)
	}
	return nil
}

// MissingCPU says what of the machine and virtual CPU the state saved on
// h needs the current host cur lacks, one phrase each; nothing is
// compared that h did not record.
func (h Host) MissingCPU(cur Host) []string {
	var missing []string
	if h.Machine != "" && h.Machine != cur.Machine {
		missing = append(missing, fmt.Sprintf("QEMU machine type %q (this host runs %q)", h.Machine, cur.Machine))
	}
	if h.CPU != "" && h.CPU != cur.CPU {
		missing = append(missing, fmt.Sprintf("CPU model %q under %s (this host would run %q)", h.CPU, h.Accel, cur.CPU))
	}
	if len(h.CPUFlags) > 0 {
		have := map[string]bool{}
		for _, f := range cur.CPUFlags {
			have[f] = true
		}
		var lack []string
		for _, f := range h.CPUFlags {
			if !have[f] {
				lack = append(lack, f)
			}
		}
		if len(lack) > 0 {
			missing = append(missing, fmt.Sprintf("CPU features %s (the guest ran on -cpu host with them)", strings.Join(lack, " ")))
		}
	}
	return missing
}

// WriteHost records h in a JSON file (next to a suspended sandbox's state).
func WriteHost(path string, h Host) error {
	b, _ := json.MarshalIndent(h, "", "  ")
	return statedir.WriteFileAtomic(path, b, 0o600)
}

// ReadHost reads a Host from a JSON file; a snapshot.json works too.
func ReadHost(path string) (Host, error) {
	var h Host
	b, err := os.ReadFile(path)
	if err != nil {
		return h, fmt.Errorf("snapshot: %w", err)
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return h, fmt.Errorf("snapshot: %s: %w", path, err)
	}
	return h, nil
}

// Snapshot is what snapshot.json holds.
type Snapshot struct {
	Name   string `json:"name"`
	Source string `json:"source"` // the sandbox it was taken of
	Parent string `json:"parent,omitempty"`
	// Template is the boot template the source sandbox started from: the
	// disk chain reaches that template's disk layer.
	Template string    `json:"template,omitempty"`
	Created  time.Time `json:"created"`

	Image       string `json:"image"`
	ImageDigest string `json:"image_digest,omitempty"`
	ImageBase   string `json:"image_base"`
	Host

	Profile     string   `json:"profile"`
	ProfileHash string   `json:"profile_hash"`
	CPUs        int      `json:"cpus"`
	MemoryMiB   int      `json:"memory_mib"`
	DiskBytes   int64    `json:"disk_bytes"` // virtual size of the guest disk
	Env         []string `json:"env,omitempty"`
	// Mounts are the source's -v mounts (HOST:GUEST[:ro,uid=N,gid=N]); a fork mounts
	// the same host folders again, under its own profile.
	Mounts []string `json:"mounts,omitempty"`
	// Ports are the source's published ports in -p notation. A fork does
	// not publish them (the source may still hold them) unless asked
	// (`smx agent restore --keep-ports`).
	Ports []string `json:"ports,omitempty"`
	// Timeout and IdleStop are the source's limits (--timeout,
	// --idle-stop) as it was given them ("10m"); a fork keeps them
	// unless its restore says otherwise.
	Timeout  string `json:"timeout,omitempty"`
	IdleStop string `json:"idle_stop,omitempty"`
	// Worktree is the source's Git worktree (--worktree): a fork works in
	// it too, narrowed to its branch like the source, since it mounts the
	// repository's .git again.
	Worktree *sandbox.Worktree `json:"worktree,omitempty"`

	MemoryStateBytes int64  `json:"memory_state_bytes"`
	DiskFileBytes    int64  `json:"disk_file_bytes"` // space the disk layer takes on the host
	MemoryDigest     string `json:"memory_digest"`   // sha256:... of memory.state
	DiskDigest       string `json:"disk_digest"`     // sha256:... of disk.qcow2
	SaveMS           int64  `json:"save_ms"`         // how long the guest was paused
	// SharedRAMBytes, for a boot template, is the space its shared-RAM
	// form takes on the host (0 while it has none); see SharedRAMPath.
	// Not part of the saved metadata: List and Get fill it in.
	SharedRAMBytes int64 `json:"shared_ram_bytes,omitempty"`
	// Origin, for a snapshot pulled from a registry, says where it came
	// from and what it was on the host that took it.
	Origin *Origin `json:"origin,omitempty"`

	Dir string `json:"-"`
}

// Origin is where a pulled snapshot came from (internal/ocisnap).
type Origin struct {
	Ref      string `json:"ref"`      // the reference it was pulled by
	Manifest string `json:"manifest"` // sha256:... of the artifact's manifest
	Signer   string `json:"signer"`   // the verifier key that signed it
	// DiskDigest is the disk layer's digest as sent: the pulling host
	// points the layer at its own copy of the base, which changes its
	// header and so DiskDigest.
	DiskDigest string `json:"disk_digest"`
	// LogHead is the record of the source sandbox's log that recorded the
	// snapshot; the restored sandbox's log links to it.
	LogHead *LogHead `json:"log_head,omitempty"`
}

// LogHead names one record of a sandbox's audit log by its hash.
type LogHead struct {
	Sandbox string `json:"sandbox"`
	LogID   string `json:"log_id"`
	Seq     int64  `json:"seq"`
	Hash    string `json:"hash"` // base64, as records.jsonl stores it
}

func (s *Snapshot) MemoryPath() string { return filepath.Join(s.Dir, memoryFile) }

// A boot template's shared-RAM form (made by the supervisor after the
// template is saved): its guest RAM as a sparse file that restores map
// private, and the state of its devices alone, saved with x-ignore-shared.
// Both are there or the form is not.
func (s *Snapshot) SharedRAMPath() string    { return filepath.Join(s.Dir, sharedRAMFile) }
func (s *Snapshot) DevicesStatePath() string { return filepath.Join(s.Dir, devicesStateFile) }

// HasSharedRAM says whether the template's shared-RAM form is complete.
func (s *Snapshot) HasSharedRAM() bool {
	_, err1 := os.Stat(s.SharedRAMPath())
	_, err2 := os.Stat(s.DevicesStatePath())
	return err1 == nil && err2 == nil
}
func (s *Snapshot) DiskPath() string    { return filepath.Join(s.Dir, diskFile) }
func (s *Snapshot) ProfilePath() string { return filepath.Join(s.Dir, profileFile) }
func (s *Snapshot) MetaPath() string    { return filepath.Join(s.Dir, metaFile) }

// The length is checked apart: a bounded repeat ({0,62}) compiles to a
// copy per count, which every smx process would pay for when it first
// checks a name.
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`) })

// ValidName reports whether name can name a snapshot.
func ValidName(name string) error {
	if len(name) > 63 || !nameRE().MatchString(name) {
		return fmt.Errorf("snapshot: invalid name %q: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalid)
	}
	return nil
}

// Store is the snapshot directory ($SMX_HOME/snapshots).
type Store struct{ Dir string }

func (s *Store) lock() (*statedir.Lock, error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return statedir.LockFile(filepath.Join(s.Dir, ".lock"))
}

// Get reads snapshot name.
func (s *Store) Get(name string) (*Snapshot, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	dir := filepath.Join(s.Dir, name)
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("snapshot %s: %w: `smx snapshot ls` lists snapshots", name, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("snapshot %s: %w", name, err)
	}
	var sn Snapshot
	if err := json.Unmarshal(b, &sn); err != nil {
		return nil, fmt.Errorf("snapshot %s: bad %s: %w", name, metaFile, err)
	}
	sn.Dir = dir
	if sn.HasSharedRAM() {
		sn.SharedRAMBytes = allocated(sn.SharedRAMPath())
	}
	return &sn, nil
}

// List returns every complete snapshot, sorted by name, and removes
// stale temporary directories of saves that died.
func (s *Store) List() ([]Snapshot, error) {
	s.cleanStale()
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("snapshot: list: %w", err)
	}
	var out []Snapshot
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		sn, err := s.Get(e.Name())
		if err != nil {
			continue
		}
		out = append(out, *sn)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove deletes snapshot name. inUse is asked under the store lock
// whether a sandbox still depends on it (its disk is backed by the
// snapshot's disk); a snapshot that is another snapshot's parent is
// refused too.
func (s *Store) Remove(name string, inUse func(name string) ([]string, error)) error {
	if _, err := s.Get(name); err != nil {
		return err
	}
	l, err := s.lock()
	if err != nil {
		return err
	}
	defer l.Unlock()
	var users []string
	if inUse != nil {
		if users, err = inUse(name); err != nil {
			return fmt.Errorf("snapshot: remove %s: %w", name, err)
		}
	}
	list, _ := s.List()
	for _, o := range list {
		if o.Parent == name {
			users = append(users, "snapshot "+o.Name)
		}
	}
	if len(users) > 0 {
		return fmt.Errorf("snapshot: remove %s: still used by %s: remove them first: %w", name, strings.Join(users, ", "), errdefs.ErrInUse)
	}
	trash := filepath.Join(s.Dir, fmt.Sprintf("%s%s-rm-%d", tmpPrefix, name, time.Now().UnixNano()))
	if err := os.Rename(filepath.Join(s.Dir, name), trash); err != nil {
		return fmt.Errorf("snapshot: remove %s: %w", name, err)
	}
	return os.RemoveAll(trash)
}

// Verify checks memory.state and disk.qcow2 against their digests, and
// the parent snapshots' layers the disk is backed by.
func (s *Store) Verify(sn *Snapshot) error {
	for seen := 0; sn != nil; seen++ {
		if seen > 64 {
			return fmt.Errorf("snapshot %s: parent chain too long: %w", sn.Name, errdefs.ErrFailed)
		}
		for _, f := range []struct{ path, want string }{
			{sn.MemoryPath(), sn.MemoryDigest},
			{sn.DiskPath(), sn.DiskDigest},
		} {
			got, _, err := FileDigest(f.path)
			if err != nil {
				return fmt.Errorf("snapshot %s: %w", sn.Name, err)
			}
			if got != f.want {
				return fmt.Errorf("snapshot %s: %s does not match its digest (have %s, recorded %s): the snapshot is corrupt; remove it with `smx snapshot rm %s`: %w",
					sn.Name, filepath.Base(f.path), short(got), short(f.want), sn.Name, errdefs.ErrFailed)
			}
		}
		if sn.Parent == "" {
			return nil
		}
		p, err := s.Get(sn.Parent)
		if err != nil {
			return fmt.Errorf("snapshot %s: parent: %w", sn.Name, err)
		}
		sn = p
	}
	return nil
}

func short(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

// FileDigest is the sha256 of a file, as "sha256:HEX", and its size.
func FileDigest(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}

// Build is a snapshot being written. Its files go in Dir; Commit makes it
// visible, Abort removes it.
type Build struct {
	store *Store
	name  string
	Dir   string
	lock  *os.File
}

func (b *Build) MemoryPath() string  { return filepath.Join(b.Dir, memoryFile) }
func (b *Build) DiskPath() string    { return filepath.Join(b.Dir, diskFile) }
func (b *Build) ProfilePath() string { return filepath.Join(b.Dir, profileFile) }

// TempDir is where a save of name in progress writes (for progress).
func (s *Store) TempDir(name string) string { return filepath.Join(s.Dir, tmpPrefix+name) }

// Begin starts a snapshot called name. It fails with ErrExists when the
// name is taken or another save of that name is in progress.
func (s *Store) Begin(name string) (*Build, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	l, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	if _, err := os.Stat(filepath.Join(s.Dir, name)); err == nil {
		return nil, fmt.Errorf("snapshot %s: %w: pick another --name or `smx snapshot rm %s`", name, errdefs.ErrExists, name)
	}
	dir := s.TempDir(name)
	for try := 0; ; try++ {
		err := os.Mkdir(dir, 0o700)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) || try > 0 {
			return nil, fmt.Errorf("snapshot %s: %w", name, err)
		}
		if !s.removeIfStale(dir) {
			return nil, fmt.Errorf("snapshot %s: another save of this name is in progress: %w", name, errdefs.ErrExists)
		}
	}
	d, err := os.Open(dir)
	if err == nil {
		err = syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("snapshot %s: %w", name, err)
	}
	return &Build{store: s, name: name, Dir: dir, lock: d}, nil
}

// Abort removes the build. It is safe after Commit (then it does nothing).
func (b *Build) Abort() {
	if b.lock == nil {
		return
	}
	os.RemoveAll(b.Dir)
	b.lock.Close()
	b.lock = nil
}

// Commit fills in sizes and digests, writes snapshot.json, makes the
// layers read-only and renames the build into place.
func (b *Build) Commit(sn Snapshot) (*Snapshot, error) {
	var err error
	if sn.MemoryDigest, sn.MemoryStateBytes, err = FileDigest(b.MemoryPath()); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", b.name, err)
	}
	return b.commit(sn)
}

// CommitVerified is Commit for a memory state whose digest and size the
// caller checked as it wrote the file (sn.MemoryDigest and
// sn.MemoryStateBytes): a pull hashes the state as it arrives, and a
// second pass over it here would only cost the time it takes.
func (b *Build) CommitVerified(sn Snapshot) (*Snapshot, error) {
	if sn.MemoryDigest == "" {
		return nil, fmt.Errorf("snapshot %s: no memory digest to commit with: %w", b.name, errdefs.ErrInvalid)
	}
	return b.commit(sn)
}

func (b *Build) commit(sn Snapshot) (*Snapshot, error) {
	sn.Name = b.name
	var err error
	if sn.DiskDigest, _, err = FileDigest(b.DiskPath()); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", b.name, err)
	}
	sn.DiskFileBytes = allocated(b.DiskPath())
	for _, p := range []string{b.MemoryPath(), b.DiskPath()} {
		if err := os.Chmod(p, 0o444); err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", b.name, err)
		}
	}
	js, _ := json.MarshalIndent(sn, "", "  ")
	if err := statedir.WriteFileAtomic(filepath.Join(b.Dir, metaFile), js, 0o444); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", b.name, err)
	}
	// fsync the files before the rename publishes them.
	for _, p := range []string{b.MemoryPath(), b.DiskPath()} {
		if f, err := os.Open(p); err == nil {
			err = f.Sync()
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("snapshot %s: sync: %w", b.name, err)
			}
		}
	}
	l, err := b.store.lock()
	if err != nil {
		return nil, err
	}
	defer l.Unlock()
	final := filepath.Join(b.store.Dir, b.name)
	if err := os.Rename(b.Dir, final); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", b.name, err)
	}
	b.lock.Close()
	b.lock = nil
	sn.Dir = final
	return &sn, nil
}

// allocated is the space a file takes on disk (holes excluded).
func allocated(path string) int64 {
	var st syscall.Stat_t
	if syscall.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// removeIfStale removes a temporary directory no live save holds.
func (s *Store) removeIfStale(dir string) bool {
	d, err := os.Open(dir)
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	defer d.Close()
	if syscall.Flock(int(d.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return false
	}
	os.RemoveAll(dir)
	return true
}

func (s *Store) cleanStale() {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			s.removeIfStale(filepath.Join(s.Dir, e.Name()))
		}
	}
}

// CopyFile copies src to dst (new file, mode 0600) keeping holes: the
// kernel's copy_file_range does the work where the filesystem allows.
func CopyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// ForkDisk creates path as a new qcow2 overlay backed by the read-only
// layer base (a snapshot's or a template's disk), of the same virtual size.
func ForkDisk(ctx context.Context, base, path string) error {
	base, err := filepath.Abs(base)
	if err != nil {
		return err
	}
	// Written directly, as qemu-img would write it: a restore would
	// otherwise wait for a process start (tens of milliseconds, far more
	// on a busy host) on its way to the guest.
	size, err := vm.QCOW2Size(base)
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := vm.CreateOverlay(path, base, size); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}
