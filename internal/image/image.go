// Package image builds and stores guest root filesystem images.
//
// An image is an ext4 filesystem in a qcow2 base file. Sandboxes never write
// to it: each one gets its own qcow2 overlay (see [Image.CreateOverlay]). The
// guest's PID 1 (smx-agent) mounts the image as / and mounts /proc, /sys,
// /dev, /dev/pts and /run itself, so images carry those directories but no
// init system.
//
// On disk a store is a directory of image directories:
//
//	DIR/.lock              flock(2) taken around every change of the set of images
//	DIR/NAME/image.json    metadata (Image)
//	DIR/NAME/disk.qcow2    the base disk
//	DIR/.tmp-NAME-RANDOM/  a build in progress (or one that crashed)
//
// A build happens entirely in a .tmp- directory that is renamed into place
// only when complete, so an interrupted build (context cancelled, crash,
// power loss) never leaves a half-written image where List or Get can see it.
package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/hosttool"
	"github.com/smx-dev/smx/internal/statedir"
)

const (
	metaFile  = "image.json"
	diskFile  = "disk.qcow2"
	lockFile  = ".lock"
	tmpPrefix = ".tmp-"
)

// Image describes one stored image. It is what image.json holds.
type Image struct {
	Name string `json:"name"`
	// Source says how the image was made: "busybox",
	// "debian:bookworm+git,curl,...", "docker-archive:/abs/file" or
	// "oci-layout:/abs/dir".
	Source string `json:"source"`
	// Digest is "sha256:..." over the filesystem tree, not over the ext4 or
	// qcow2 bytes: mkfs writes UUIDs, hash seeds and timestamps, so two
	// builds of the same content give different disks but the same digest.
	// The tree hash covers every entry's path, type, mode, owner, file
	// contents and link target, and ignores timestamps. See treeDigest.
	Digest    string    `json:"digest"`
	Created   time.Time `json:"created"`
	Size      int64     `json:"size"`       // virtual size of the disk in bytes
	DiskBytes int64     `json:"disk_bytes"` // bytes the qcow2 file uses on the host
	Path      string    `json:"path"`       // the qcow2 base file
	// Config is the OCI image config of an imported image; nil for built ones.
	Config *OCIConfig `json:"config,omitempty"`
}

// OCIConfig is the part of an OCI/Docker image config that says how to run
// the image, kept so that a later `smx agent run` can honour it.
type OCIConfig struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Store is the image directory ($SMX_HOME/images). The zero value is not
// usable; set Dir. A Store holds no state besides Dir, so several Stores (in
// one process or in several CLIs) on the same directory are safe together.
type Store struct {
	Dir string
}

// The length is checked apart: a bounded repeat ({0,62}) compiles to a
// copy per count, which every smx process would pay for when it first
// checks a name.
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`) })

// ValidName reports whether name can name an image. Names are used as
// directory names, so the rule keeps them short, lower case and free of path
// separators and leading dots.
func ValidName(name string) error {
	if len(name) > 63 || !nameRE().MatchString(name) {
		return fmt.Errorf("image: invalid name %q: use 1-63 characters a-z 0-9 . _ - starting with a letter or digit: %w", name, errdefs.ErrInvalid)
	}
	return nil
}

// Get returns the image called name.
func (s *Store) Get(name string) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	im, err := s.load(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("image: image %s not found: build one with `smx image build %s --from busybox`: %w", name, name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("image: get %s: %w", name, err)
	}
	return im, nil
}

// load reads DIR/NAME/image.json. It returns an fs.ErrNotExist error when
// the image is absent or incomplete.
func (s *Store) load(name string) (*Image, error) {
	dir := filepath.Join(s.Dir, name)
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return nil, err
	}
	var im Image
	if err := json.Unmarshal(b, &im); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, metaFile), err)
	}
	// Path is recomputed rather than trusted so that moving $SMX_HOME keeps
	// the store working.
	im.Name = name
	im.Path = filepath.Join(dir, diskFile)
	st, err := os.Stat(im.Path)
	if err != nil {
		return nil, err
	}
	im.DiskBytes = st.Sys().(*syscall.Stat_t).Blocks * 512
	return &im, nil
}

// List returns the complete images sorted by name. Directories that are not
// complete images are skipped, and leftovers of crashed builds or removals
// are deleted on the way.
func (s *Store) List() ([]Image, error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("image: list: %w", err)
	}
	var out []Image
	stale := false
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, tmpPrefix) {
			stale = true
			continue
		}
		if !e.IsDir() || ValidName(n) != nil {
			continue
		}
		im, err := s.load(n)
		if err != nil {
			continue // not (yet) an image; nothing we should show
		}
		out = append(out, *im)
	}
	if stale {
		// Cleaning is best effort: a failure to delete garbage must not stop
		// the user from seeing their images.
		_ = s.cleanStale()
	}
	slices.SortFunc(out, func(a, b Image) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Remove deletes the image called name. inUse, if not nil, is asked under
// the store lock whether a sandbox still uses the image (its disk overlay
// has the image's disk as backing file); if it says yes, Remove refuses with
// ErrInUse.
func (s *Store) Remove(name string, inUse func(name string) (bool, error)) error {
	if err := ValidName(name); err != nil {
		return err
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	dir := filepath.Join(s.Dir, name)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image: remove: image %s not found (see `smx image ls`): %w", name, errdefs.ErrNotFound)
	}
	if inUse != nil {
		used, err := inUse(name)
		if err != nil {
			return fmt.Errorf("image: remove %s: %w", name, err)
		}
		if used {
			return fmt.Errorf("image: remove %s: a sandbox uses it: remove that sandbox first: %w", name, errdefs.ErrInUse)
		}
	}
	// Rename first so that a crash half-way through the delete leaves only
	// a .tmp- directory, which List ignores and cleans, never a broken image.
	trash := filepath.Join(s.Dir, fmt.Sprintf("%s%s-rm-%d", tmpPrefix, name, time.Now().UnixNano()))
	if err := os.Rename(dir, trash); err != nil {
		return fmt.Errorf("image: remove %s: %w", name, err)
	}
	if err := removeTree(trash); err != nil {
		return fmt.Errorf("image: remove %s: %w", name, err)
	}
	return nil
}

// CreateOverlay creates a qcow2 file at path whose backing file is the
// image's disk, with a virtual size of size bytes (0 means the image's
// size). The guest sees a disk of that size holding the image's filesystem;
// growing the filesystem into the extra space is the guest's job.
func (im *Image) CreateOverlay(ctx context.Context, path string, size int64) error {
	if size == 0 {
		size = im.Size
	}
	if size < im.Size {
		return fmt.Errorf("image: overlay for %s: size %d is smaller than the image (%d bytes): %w", im.Name, size, im.Size, errdefs.ErrInvalid)
	}
	qemuImg, err := hosttool.Look("qemu-img")
	if err != nil {
		return fmt.Errorf("image: overlay: qemu-img not found: install qemu-utils (run `smx setup`): %w", errdefs.ErrUnavailable)
	}
	// qemu resolves a relative backing path against the overlay's
	// directory, not ours.
	base, err := filepath.Abs(im.Path)
	if err != nil {
		return fmt.Errorf("image: overlay for %s: %w", im.Name, err)
	}
	out, err := exec.CommandContext(ctx, qemuImg, "create", "-q", "-f", "qcow2",
		"-b", base, "-F", "qcow2", path, strconv.FormatInt(size, 10)).CombinedOutput()
	if err != nil {
		return fmt.Errorf("image: overlay for %s: qemu-img create: %v: %s", im.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// lock takes the store-wide lock. It guards every change of which names
// exist (final rename, remove) and the creation and cleaning of build
// directories, so it is only ever held briefly.
func (s *Store) lock() (unlock func(), err error) {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	l, err := statedir.LockFile(filepath.Join(s.Dir, lockFile))
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	return func() { l.Unlock() }, nil
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}

// cleanStale deletes .tmp- directories that no live build holds. A build
// keeps an flock on its directory for its whole life, so a directory whose
// lock we can take belongs to a process that is gone.
func (s *Store) cleanStale() error {
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), tmpPrefix) {
			continue
		}
		p := filepath.Join(s.Dir, e.Name())
		d, err := os.Open(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if flock(d, syscall.LOCK_EX|syscall.LOCK_NB) != nil {
			d.Close() // a build is running
			continue
		}
		errs = append(errs, removeTree(p))
		d.Close()
	}
	return errors.Join(errs...)
}

// removeTree is os.RemoveAll that first detaches anything mounted inside
// dir. debootstrap mounts /proc, /sys and sometimes a /dev into its target;
// if it is killed before its exit trap runs, a plain RemoveAll would walk
// into those mounts, and a bind-mounted host /dev would lose its nodes.
func removeTree(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	// Deepest first, so children go before their parents.
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mounts {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s before removing %s: %w (unmount it by hand, then run `smx image ls`)", m, dir, err)
		}
	}
	return os.RemoveAll(dir)
}

// mountsUnder lists the mount points at or below dir.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, nil // no procfs: nothing we could unmount anyway
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		abs = r
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountinfo(f[4])
		if mp == abs || strings.HasPrefix(mp, abs+"/") {
			out = append(out, mp)
		}
	}
	return out, nil
}

// unescapeMountinfo undoes the octal escapes (\040 for space...) the kernel
// uses in /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
