package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/hosttool"
)

const mib = 1 << 20

// build is one image being made in a private .tmp- directory. Its owner
// fills root (through tree, or directly for debootstrap), then calls finish,
// which turns the tree into a disk and publishes it; abort, deferred
// unconditionally, removes whatever is left.
type build struct {
	s        *Store
	name     string
	dir      string   // DIR/.tmp-NAME-RANDOM
	held     *os.File // flock on dir while the build lives; see cleanStale
	progress io.Writer
	tree     *tree
	done     bool
}

// unprivileged forces the non-root code path in tests run as root.
var unprivileged = false

func privileged() bool { return os.Geteuid() == 0 && !unprivileged }

// begin starts a build of name. The caller must defer b.abort().
func (s *Store) begin(name string, progress io.Writer) (*build, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	if err := s.checkFree(name); err != nil {
		return nil, err
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	// The directory is created and locked under the store lock, so
	// cleanStale (which takes the store lock too) never sees it unlocked.
	dir, err := os.MkdirTemp(s.Dir, tmpPrefix+name+"-")
	if err != nil {
		return nil, fmt.Errorf("image: build %s: %w", name, err)
	}
	held, err := os.Open(dir)
	if err == nil {
		err = flock(held, syscall.LOCK_EX|syscall.LOCK_NB)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("image: build %s: lock %s: %w", name, dir, err)
	}
	b := &build{s: s, name: name, dir: dir, held: held, progress: progress}
	b.tree, err = newTree(filepath.Join(dir, "root"), privileged())
	if err != nil {
		b.abort()
		return nil, fmt.Errorf("image: build %s: %w", name, err)
	}
	return b, nil
}

func (s *Store) checkFree(name string) error {
	if _, err := os.Lstat(filepath.Join(s.Dir, name)); err == nil {
		return fmt.Errorf("image: build %s: image %s already exists: use `smx image rm %s` first: %w", name, name, name, errdefs.ErrExists)
	}
	return nil
}

func (b *build) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "image: "+format+"\n", args...)
}

// abort removes the build directory unless finish published it. It is safe
// to call more than once.
func (b *build) abort() {
	if b.tree != nil {
		b.tree.Close()
	}
	if !b.done {
		removeTree(b.dir)
	}
	if b.held != nil {
		b.held.Close()
		b.held = nil
	}
}

// sizing says how big a filesystem to make for content of a given size.
type sizing struct {
	min      int64
	headroom int64 // added to content*1.3
}

var (
	smallSizing = sizing{min: 64 * mib, headroom: 32 * mib}
	largeSizing = sizing{min: 256 * mib, headroom: 256 * mib}
)

func (z sizing) size(content int64) int64 {
	n := max(content+content*3/10+z.headroom, z.min)
	return (n + mib - 1) / mib * mib
}

// finish turns the tree into DIR/NAME/disk.qcow2 and publishes the image.
func (b *build) finish(ctx context.Context, source string, z sizing, cfg *OCIConfig) (*Image, error) {
	fail := func(op string, err error) (*Image, error) {
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w (%v)", ctxErr, err)
		}
		return nil, fmt.Errorf("image: build %s: %s: %w", b.name, op, err)
	}
	digest, st, err := b.tree.digest(ctx)
	if err != nil {
		return fail("hash tree", err)
	}
	size := z.size(st.bytes)
	raw := filepath.Join(b.dir, "raw.img")
	b.logf("mkfs.ext4 (%d MiB)", size/mib)
	args := []string{"-q", "-F", "-d", b.tree.dir, "-L", "smx-root",
		"-E", "root_owner=0:0",
		// A sandbox disk runs no system daemons that need reserved blocks.
		"-m", "0",
		// 4 KiB blocks even for small images (mke2fs would pick 1 KiB):
		// sandboxes grow the filesystem to their --disk size at boot, and
		// with 1 KiB blocks that means 16x the block groups to add, which
		// under TCG costs hundreds of milliseconds.
		"-b", "4096"}
	// mke2fs picks one inode per 16 KiB (4 KiB below 512 MiB); trees of
	// many small files (node_modules) would run out, so ask for more.
	if want := st.entries*2 + 8192; want > size/16384 {
		args = append(args, "-N", strconv.FormatInt(want, 10))
	}
	args = append(args, raw, strconv.FormatInt(size/1024, 10)+"k")
	if err := runTool(ctx, nil, "mkfs.ext4", args...); err != nil {
		return fail("mkfs.ext4", err)
	}
	if !b.tree.privileged {
		if err := b.fixupOwners(ctx, raw); err != nil {
			return fail("set owners", err)
		}
	}
	// The tree is no longer needed; freeing it now halves peak disk use.
	b.tree.Close()
	if err := removeTree(b.tree.dir); err != nil {
		return fail("remove root tree", err)
	}
	b.logf("converting to qcow2")
	disk := filepath.Join(b.dir, diskFile)
	if err := runTool(ctx, nil, "qemu-img", "convert", "-O", "qcow2", raw, disk); err != nil {
		return fail("qemu-img convert", err)
	}
	if err := os.Remove(raw); err != nil {
		return fail("remove raw", err)
	}
	// The base is shared by every sandbox made from it; a write (say, a
	// stray `qemu-img commit`) would corrupt them all.
	if err := os.Chmod(disk, 0o444); err != nil {
		return fail("chmod disk", err)
	}
	im := &Image{
		Name:    b.name,
		Source:  source,
		Digest:  digest,
		Created: time.Now().UTC().Truncate(time.Second),
		Size:    size,
		Path:    filepath.Join(b.s.Dir, b.name, diskFile), // for readers of the file; load recomputes it
		Config:  cfg,
	}
	js, err := json.MarshalIndent(im, "", "  ")
	if err != nil {
		return fail("encode", err)
	}
	if err := writeFileSync(filepath.Join(b.dir, metaFile), append(js, '\n')); err != nil {
		return fail("write metadata", err)
	}
	if err := ctx.Err(); err != nil {
		return fail("publish", err)
	}
	if err := b.publish(); err != nil {
		return nil, err
	}
	b.logf("done: %s %s", b.name, digest)
	return b.s.Get(b.name)
}

// publish renames the build directory to its final name under the store
// lock, re-checking that the name is still free (another CLI may have built
// it meanwhile).
func (b *build) publish() error {
	unlock, err := b.s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if err := b.s.checkFree(b.name); err != nil {
		return err
	}
	final := filepath.Join(b.s.Dir, b.name)
	if err := os.Rename(b.dir, final); err != nil {
		return fmt.Errorf("image: build %s: publish: %w", b.name, err)
	}
	b.done = true
	// Make the rename durable before we report success.
	if d, err := os.Open(b.s.Dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

func (b *build) fixupOwners(ctx context.Context, raw string) error {
	script, err := b.tree.debugfsScript()
	if err != nil {
		return err
	}
	sf := filepath.Join(b.dir, "owners.debugfs")
	if err := os.WriteFile(sf, []byte(script), 0o600); err != nil {
		return err
	}
	// debugfs exits 0 even when a command fails; failures show up on
	// stderr, after its version banner.
	debugfs, err := hosttool.Look("debugfs")
	if err != nil {
		return missingTool("debugfs")
	}
	cmd := exec.CommandContext(ctx, debugfs, "-w", "-f", sf, raw)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("debugfs: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	for line := range strings.SplitSeq(stderr.String(), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "debugfs ") {
			return fmt.Errorf("debugfs: %s", line)
		}
	}
	return nil
}

func writeFileSync(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// runTool runs a host tool. With progress nil, output is kept for the error
// message; otherwise it is streamed to progress. Cancelling ctx sends
// SIGTERM to the tool's whole process group (debootstrap is a shell script
// whose exit trap unmounts what it mounted), and SIGKILL 30 s later.
func runTool(ctx context.Context, progress io.Writer, name string, args ...string) error {
	path, err := hosttool.Look(name)
	if err != nil {
		return missingTool(name)
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	var out strings.Builder
	if progress != nil {
		cmd.Stdout, cmd.Stderr = progress, progress
	} else {
		cmd.Stdout, cmd.Stderr = &out, &out
	}
	err = cmd.Run()
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	msg := strings.TrimSpace(out.String())
	if len(msg) > 2000 {
		msg = "..." + msg[len(msg)-2000:]
	}
	if msg == "" {
		return fmt.Errorf("%s: %w", name, err)
	}
	return fmt.Errorf("%s: %w: %s", name, err, msg)
}

var toolPackage = map[string]string{
	"mkfs.ext4":   "e2fsprogs",
	"debugfs":     "e2fsprogs",
	"qemu-img":    "qemu-utils",
	"debootstrap": "debootstrap",
}

func missingTool(name string) error {
	return fmt.Errorf("%s not found: install %s (run `smx setup`): %w", name, toolPackage[name], errdefs.ErrUnavailable)
}

// checkTools fails early, before any slow step, when a tool is missing.
func checkTools(names ...string) error {
	for _, n := range names {
		if _, err := hosttool.Look(n); err != nil {
			return missingTool(n)
		}
	}
	return nil
}

// ensureGuestDirs creates the directories smx-agent mounts on and the few
// every program expects, keeping existing ones as they are.
func ensureGuestDirs(t *tree) error {
	for _, d := range []struct {
		path string
		perm fs.FileMode
	}{
		{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755}, {"run", 0o755},
		{"tmp", 0o777 | fs.ModeSticky}, {"etc", 0o755}, {"root", 0o700},
	} {
		if _, err := t.root.Lstat(d.path); err == nil {
			continue // the image's own choice (even a symlink) wins
		}
		if err := t.mkdir(d.path, d.perm, 0, 0); err != nil {
			return err
		}
	}
	return nil
}
