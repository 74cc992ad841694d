package shim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// The host mounts a pod's app containers into its share, which the guest
// writes through the file gateway (as root on the host). So no mount or
// unmount here goes by a path the guest could have changed: targets are
// opened beneath their root with no symbolic link followed (openat2
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), trees are attached to those
// descriptors (open_tree + move_mount), and a mount is detached through
// the descriptor of its own root, kept from the moment it was made.

// openBeneath opens rel under dir as an O_PATH descriptor: no component
// may be a symbolic link (the last one included: with O_DIRECTORY in
// flags a link fails, without it the caller checks the type), and nothing
// may resolve outside dir. extra is added to the resolve flags (e.g.
// RESOLVE_NO_XDEV).
func openBeneath(dir *os.File, rel string, flags int, extra uint64) (*os.File, error) {
	fd, err := unix.Openat2(int(dir.Fd()), rel, &unix.OpenHow{
		Flags:   uint64(unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW | flags),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | extra,
	})
	if err != nil {
		return nil, &os.PathError{Op: "openat2", Path: rel, Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir.Name(), rel)), nil
}

// bindAt binds src (with the mounts below it when rec) onto target,
// read-only (the top mount only) when ro, and returns the descriptor of
// the new mount's root: detach unmounts exactly that mount, wherever the
// guest has moved things since. The new mount does not propagate.
func bindAt(src string, target *os.File, rec, ro bool) (*os.File, error) {
	flags := unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC
	if rec {
		flags |= unix.AT_RECURSIVE
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, uint(flags))
	if err != nil {
		return nil, fmt.Errorf("bind %s: open_tree: %w", src, err)
	}
	attr := unix.MountAttr{Propagation: unix.MS_PRIVATE}
	if ro {
		attr.Attr_set = unix.MOUNT_ATTR_RDONLY
	}
	// Without AT_RECURSIVE: volumes bound below keep their own mode.
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s: mount_setattr: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", int(target.Fd()), "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s on %s: move_mount: %w", src, target.Name(), err)
	}
	return os.NewFile(uintptr(fd), target.Name()), nil
}

// detach unmounts, lazily, the mount whose root f is (from bindAt), and
// closes f. The kernel resolves /proc/self/fd/N to that very mount; no
// name in the guest's reach is looked up.
func detach(f *os.File) error {
	defer f.Close()
	p := "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w", f.Name(), err)
	}
	return nil
}

// podShare is a pod's share. The guest sees view (shared at
// PodShareGuest): a read-only bind of dirs, a directory only the shim
// writes, so the guest can neither rename nor replace a container's
// folder (view/ID/rootfs) in it; each app container's root is mounted
// onto its folder in view, read-write as its spec says.
type podShare struct {
	view, dirs string
	viewFD     *os.File // the root of view's read-only mount
}

// sharePaths are a pod's share and its shim-only directory in the
// sandbox container's bundle.
func sharePaths(bundle string) (view, dirs string) {
	return filepath.Join(bundle, "pod"), filepath.Join(bundle, "pod.dirs")
}

// newPodShare makes the share of the pod whose sandbox bundle is bundle.
func newPodShare(bundle string) (_ *podShare, retErr error) {
	view, dirs := sharePaths(bundle)
	for _, d := range []string{dirs, view} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("pod share: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			os.Remove(view)
			os.Remove(dirs)
		}
	}()
	// Both are in containerd's bundle, which only root writes, and were
	// made just now.
	target, err := os.OpenFile(view, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("pod share: %w", err)
	}
	defer target.Close()
	m, err := bindAt(dirs, target, false, true)
	if err != nil {
		return nil, fmt.Errorf("pod share: %w", err)
	}
	return &podShare{view: view, dirs: dirs, viewFD: m}, nil
}

// add makes app container id's folder and returns its mount point in the
// view (ID/rootfs), opened beneath the view in the view's own mount.
func (p *podShare) add(id string) (*os.File, error) {
	if !validID(id) {
		return nil, fmt.Errorf("container ID %q cannot name a folder", id)
	}
	if err := os.MkdirAll(filepath.Join(p.dirs, id, "rootfs"), 0o755); err != nil {
		return nil, err
	}
	return openBeneath(p.viewFD, filepath.Join(id, "rootfs"), unix.O_DIRECTORY, unix.RESOLVE_NO_XDEV)
}

// remove deletes container id's (empty) folder.
func (p *podShare) remove(id string) {
	if validID(id) {
		os.Remove(filepath.Join(p.dirs, id, "rootfs"))
		os.Remove(filepath.Join(p.dirs, id))
	}
}

// close detaches the view and everything still mounted below it, and
// removes the share's directories (never recursively: a mount missed
// would take host files along).
func (p *podShare) close() error {
	var errs []error
	if p.viewFD != nil {
		errs = append(errs, detach(p.viewFD))
		p.viewFD = nil
	}
	for _, d := range []string{p.view, p.dirs} {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove pod share: %w", err))
		}
	}
	return errors.Join(errs...)
}

// validID reports whether a container ID is one folder name.
func validID(id string) bool {
	return id != "" && id != "." && id != ".." && filepath.Base(id) == id && len(id) <= 255
}
