package shim

import (
	"bufio"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/testutil"
)

// mounted reports whether p is a mount point in this mount namespace.
func mounted(t *testing.T, p string) bool {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) > 4 && unescapeMount(fs[4]) == p {
			return true
		}
	}
	return false
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// hostDir is a host directory outside any pod with a tmpfs mounted on
// each of names: what a guest would like the shim to mount over or
// unmount.
func hostDir(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		p := filepath.Join(dir, n)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatalf("mount tmpfs on %s: %v", p, err)
		}
		if err := os.WriteFile(filepath.Join(p, "host-file"), []byte("host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Unmount(p, unix.MNT_DETACH) })
	}
	return dir
}

// podFixture is a pod's share and an app container's root with one
// volume at /a/data, mounted as the shim mounts them.
type podFixture struct {
	share        *podShare
	bundle       string // the pod's sandbox container's bundle
	rootfs, vol  string
	containerDir string // the container's folder as the guest sees it
	mounts       hostMounts
}

func newPodFixture(t *testing.T, id string) *podFixture {
	t.Helper()
	testutil.Require(t, os.Geteuid() == 0, "root", "mounts need root: run as root")
	base := t.TempDir()
	bundle := filepath.Join(base, "sandbox-bundle")
	if err := os.Mkdir(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	share, err := newPodShare(bundle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { share.close() })
	f := &podFixture{share: share, bundle: bundle, rootfs: filepath.Join(base, "rootfs"), vol: filepath.Join(base, "vol"),
		containerDir: filepath.Join(share.view, id)}
	// The container's snapshot, mounted in its bundle as containerd's
	// mounts would be.
	if err := os.MkdirAll(f.rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", f.rootfs, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount the container's root: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(f.rootfs, unix.MNT_DETACH) })
	for _, d := range []string{filepath.Join(f.rootfs, "a"), f.vol} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f *podFixture) mount(t *testing.T, id string) error {
	t.Helper()
	spec := &specs.Spec{Mounts: []specs.Mount{{Destination: "/a/data", Type: "bind", Source: f.vol, Options: []string{"rbind", "rw"}}}}
	ms, _, err := mountContainer(spec, f.rootfs, f.share, id)
	f.mounts = ms
	t.Cleanup(func() { f.mounts.undo() })
	return err
}

// TestShareFolderPlantedSymlink: a guest that plants a symbolic link
// where the shim is about to mount a container's root (its folder in the
// pod's share, or the folder's rootfs) gets neither: the share's top is
// read-only to it, and a link there anyway is not followed — the host
// directory it names is not mounted over. (Before, the shim made
// share/ID/rootfs with MkdirAll and mounted on that path, following
// whatever link the guest had put there meanwhile.)
func TestShareFolderPlantedSymlink(t *testing.T) {
	const id = "c1"
	f := newPodFixture(t, id)
	host := hostDir(t)
	victim := filepath.Join(host, "etc")
	if err := os.Mkdir(victim, 0o755); err != nil {
		t.Fatal(err)
	}
	// The guest, writing through the file gateway into the share.
	for _, try := range []func() error{
		func() error { return os.Symlink(victim, f.containerDir) },
		func() error { return os.Mkdir(f.containerDir, 0o755) },
	} {
		if err := try(); !errors.Is(err, unix.EROFS) {
			t.Fatalf("guest writes the share's top: %v, want EROFS", err)
		}
	}
	// A link in the container's folder anyway (as if planted): refused.
	if err := os.MkdirAll(filepath.Join(f.share.dirs, id), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(f.share.dirs, id, "rootfs")); err != nil {
		t.Fatal(err)
	}
	err := f.mount(t, id)
	if err == nil {
		t.Fatal("mounted a container's root on a planted symbolic link")
	}
	t.Logf("refused: %v", err)
	if mounted(t, victim) {
		t.Fatalf("the host directory %s, named by the planted link, was mounted over", victim)
	}
}

// TestShareRenameBeforeUnmount: once a container's root is mounted, the
// guest (root, writing its root through the share) renames the folder
// above a volume and leaves a symbolic link to a host directory in its
// place, and tries to rename the container's folder and put a link there;
// the shim's unmounts then detach its own mounts, and the host's mounts
// at the paths the links name stay. (Before, the unmount went by path
// and followed the links: root on the host unmounted HOST/data and
// HOST/rootfs.)
func TestShareRenameBeforeUnmount(t *testing.T) {
	const id = "c1"
	f := newPodFixture(t, id)
	host := hostDir(t, "data", "rootfs")
	if err := f.mount(t, id); err != nil {
		t.Fatal(err)
	}
	guestRoot := filepath.Join(f.containerDir, "rootfs")
	if _, err := os.Stat(filepath.Join(guestRoot, "a", "data")); err != nil {
		t.Fatalf("the volume in the container's root: %v", err)
	}
	// The container's folder: read-only to the guest.
	if err := os.Rename(f.containerDir, filepath.Join(f.share.view, "moved")); !errors.Is(err, unix.EROFS) {
		t.Fatalf("guest renames the container's folder: %v, want EROFS", err)
	}
	// Inside its root, writable: rename the volume's parent, plant a link.
	if err := os.Rename(filepath.Join(guestRoot, "a"), filepath.Join(guestRoot, "b")); err != nil {
		t.Fatalf("guest renames a/: %v", err)
	}
	if err := os.Symlink(host, filepath.Join(guestRoot, "a")); err != nil {
		t.Fatal(err)
	}
	if err := f.mounts.undo(); err != nil {
		t.Fatalf("undo: %v", err)
	}
	for _, n := range []string{"data", "rootfs"} {
		if !mounted(t, filepath.Join(host, n)) {
			t.Fatalf("the host's mount %s was unmounted by the container's cleanup", filepath.Join(host, n))
		}
	}
	for _, p := range []string{guestRoot, filepath.Join(f.rootfs, "b", "data")} {
		if mounted(t, p) {
			t.Fatalf("%s is still mounted after undo", p)
		}
	}
	f.share.remove(id)
	if err := f.share.close(); err != nil {
		t.Fatalf("close the share: %v", err)
	}
	if mounted(t, f.share.view) {
		t.Fatal("the share's view is still mounted")
	}
}

// TestShareCleanupAfterShimDeath: the shim dies with a container's root
// and volume mounted (their descriptors gone with it); the guest renames
// the volume's parent and leaves a link to a host directory in its
// place; containerd's delete actions (the container's, then the pod's)
// leave no mount of the pod behind and the host's mounts at the linked
// paths in place.
func TestShareCleanupAfterShimDeath(t *testing.T) {
	const id = "c1"
	f := newPodFixture(t, id)
	host := hostDir(t, "data", "rootfs")
	if err := f.mount(t, id); err != nil {
		t.Fatal(err)
	}
	for _, m := range f.mounts {
		m.Close() // the shim is gone: its descriptors with it
	}
	f.mounts = nil
	f.share.viewFD.Close()
	f.share.viewFD = nil
	guestRoot := filepath.Join(f.containerDir, "rootfs")
	if err := os.Rename(filepath.Join(guestRoot, "a"), filepath.Join(guestRoot, "b")); err != nil {
		t.Fatalf("guest renames a/: %v", err)
	}
	if err := os.Symlink(host, filepath.Join(guestRoot, "a")); err != nil {
		t.Fatal(err)
	}
	// The app container's delete action, then the pod's.
	ctx := context.Background()
	cleanupContainer(ctx, f.bundle, id)
	if err := unix.Unmount(f.rootfs, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		t.Fatalf("unmount the container's root: %v", err)
	}
	cleanupShare(ctx, f.bundle)
	for _, n := range []string{"data", "rootfs"} {
		if !mounted(t, filepath.Join(host, n)) {
			t.Fatalf("the host's mount %s was unmounted by the cleanup", filepath.Join(host, n))
		}
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	if base := filepath.Dir(f.bundle); strings.Contains(string(b), base) {
		t.Fatalf("mounts of the pod left:\n%s", b)
	}
	for _, p := range []string{f.share.view, f.share.dirs} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s left: %v", p, err)
		}
	}
}
