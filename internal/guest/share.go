package guest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
)

// Host folders reach the guest as 9P2000.L served by the host's file
// gateway over a control-channel stream (OpMountData). The kernel cannot
// write to a virtio-serial port itself, so the agent relays the stream to
// one end of a socketpair and hands the other end to the kernel with
// trans=fd (OpMount).

// DefaultMSize is the 9P message size when the host asks for none: the fd
// transport's largest.
const DefaultMSize = 1 << 20

var shareTag = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`) })

// shares holds the kernel ends of relays that are open but not mounted yet.
var shares = struct {
	sync.Mutex
	pending map[string]*os.File
	cond    *sync.Cond
}{pending: map[string]*os.File{}}

func init() { shares.cond = sync.NewCond(&shares.Mutex) }

// mountData relays stream to a new socketpair until either side ends.
func (s *Server) mountData(stream io.ReadWriteCloser, m *agentproto.MountRequest) error {
	if m == nil || !shareTag().MatchString(m.Tag) {
		return errors.New("guest: mount-data: bad tag")
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("guest: mount-data: socketpair: %w", err)
	}
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	// Non-blocking, so that reads wait in Go's network poller (see
	// newRelay).
	unix.SetNonblock(fds[0], true)
	relay := os.NewFile(uintptr(fds[0]), "share-relay-"+m.Tag)
	kernel := os.NewFile(uintptr(fds[1]), "share-kernel-"+m.Tag)
	shares.Lock()
	if old := shares.pending[m.Tag]; old != nil {
		old.Close()
	}
	shares.pending[m.Tag] = kernel
	shares.cond.Broadcast()
	shares.Unlock()

	done := make(chan struct{}, 2)
	go func() {
		buf := make([]byte, 1<<20)
		io.CopyBuffer(relay, stream, buf)
		done <- struct{}{}
	}()
	go func() {
		buf := make([]byte, 1<<20)
		io.CopyBuffer(stream, relay, buf)
		done <- struct{}{}
	}()
	<-done
	// Either side ended: end both. The kernel's mount then fails its
	// requests (EIO) until it is unmounted.
	relay.Close()
	stream.Close()
	<-done
	s.Log.Debug("share relay ended", "tag", m.Tag)
	return nil
}

// mountShare mounts the share whose data stream is open, and the overlay
// over it that the request asks for.
func (s *Server) mountShare(w io.Writer, m *agentproto.MountRequest) error {
	if err := s.attachShare(m); err != nil {
		return err
	}
	if m.Overlay != "" {
		if err := mountOverlay(m); err != nil {
			return err
		}
	}
	return agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true})
}

// attachShare mounts the share at m.Path.
func (s *Server) attachShare(m *agentproto.MountRequest) error {
	if m == nil || !shareTag().MatchString(m.Tag) {
		return errors.New("guest: mount: bad tag")
	}
	if !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path || m.Path == "/" {
		return fmt.Errorf("guest: mount: %q is not an absolute, clean path other than /", m.Path)
	}
	if m.VirtioFS != "" {
		if err := bindVirtioFS(m); err != nil {
			return err
		}
		return nil
	}
	msize := m.MSize
	if msize <= 0 {
		msize = DefaultMSize
	}
	common := ",version=9p2000.L,msize=" + strconv.Itoa(msize) + ",cache=mmap,access=client"
	var source, opts string
	var fresh *relay // closed if the mount fails
	switch {
	case m.Port != 0 && (m.Relay || relayed(m)):
		if net.ParseIP(m.Addr) == nil || m.Port < 1 || m.Port > 65535 {
			return fmt.Errorf("guest: mount: bad address %q port %d", m.Addr, m.Port)
		}
		if relayed(m) {
			// Restored: the kernel's session is intact; only the
			// connection to the gateway died with the old supervisor.
			// (Whatever transport the new supervisor prefers: the
			// guest's own state decides, so forks keep their files.)
			relays.Lock()
			r := relays.m[m.Tag]
			relays.Unlock()
			if err := r.reconnect(); err != nil {
				return err
			}
			return nil
		}
		setSlowStart(s)
		r, kernel, err := newRelay(m.Tag, m.Addr, m.Port, s.Log)
		if err != nil {
			return err
		}
		relays.Lock()
		relays.m[m.Tag] = r
		relays.Unlock()
		fresh = r
		defer kernel.Close() // the kernel holds its own reference once mounted
		fd := strconv.Itoa(int(kernel.Fd()))
		source, opts = "smx-"+m.Tag, "trans=fd,rfdno="+fd+",wfdno="+fd+common
	case m.Port != 0:
		// The kernel connects to the gateway itself: no relay.
		if net.ParseIP(m.Addr) == nil || m.Port < 1 || m.Port > 65535 {
			return fmt.Errorf("guest: mount: bad address %q port %d", m.Addr, m.Port)
		}
		source, opts = m.Addr, "trans=tcp,port="+strconv.Itoa(m.Port)+",privport"+common
		setSlowStart(s)
	default:
		kernel, err := takeShare(m.Tag, 10*time.Second)
		if err != nil {
			return err
		}
		defer kernel.Close() // the kernel holds its own reference once mounted
		fd := strconv.Itoa(int(kernel.Fd()))
		source, opts = "smx-"+m.Tag, "trans=fd,rfdno="+fd+",wfdno="+fd+common
	}
	// After a restore the share is mounted already, on a 9P session that
	// died with the supervisor that saved the guest (and that no relay can
	// rebuild): detach it, so new lookups reach the new session. (Files
	// and working directories still open on the old one fail with EIO.)
	if isShareMount(m.Path) {
		if err := unix.Unmount(m.Path, unix.MNT_DETACH); err != nil {
			s.Log.Warn("detach stale share", "path", m.Path, "err", err)
		}
	}
	if err := os.MkdirAll(m.Path, 0o755); err != nil {
		return fmt.Errorf("guest: mount: %w", err)
	}
	// A guest that did not load the 9p modules at boot (restored from a
	// boot template, say) loads the ones it kept now.
	if err := LoadKept(); err != nil {
		s.Log.Warn("load 9p modules", "err", err)
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if m.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(source, m.Path, "9p", flags, opts); err != nil {
		if fresh != nil {
			fresh.kernel.Close()
		}
		return fmt.Errorf("guest: mount %s on %s: %w", m.Tag, m.Path, err)
	}
	return nil
}

// relayed reports whether share m is mounted through a relay that is still
// in use: a guest restored from a state saved with the share relayed.
func relayed(m *agentproto.MountRequest) bool {
	relays.Lock()
	r := relays.m[m.Tag]
	relays.Unlock()
	return r != nil && r.alive() && r.addr == m.Addr && r.port == m.Port && isShareMount(m.Path)
}

// setSlowStart keeps TCP from restarting slow start after every pause: 9P
// is request/response with pauses in between, and the link is a socketpair
// to the supervisor, not a network to be gentle with.
func setSlowStart(s *Server) {
	if err := os.WriteFile("/proc/sys/net/ipv4/tcp_slow_start_after_idle", []byte("0\n"), 0o644); err != nil {
		s.Log.Warn("tcp_slow_start_after_idle", "err", err)
	}
}

func takeShare(tag string, wait time.Duration) (*os.File, error) {
	deadline := time.Now().Add(wait)
	t := time.AfterFunc(wait, func() { shares.Lock(); shares.cond.Broadcast(); shares.Unlock() })
	defer t.Stop()
	shares.Lock()
	defer shares.Unlock()
	for shares.pending[tag] == nil {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("guest: mount: no data stream for share %s", tag)
		}
		shares.cond.Wait()
	}
	f := shares.pending[tag]
	delete(shares.pending, tag)
	return f, nil
}

// isShareMount reports whether a 9p file system is mounted at p.
func isShareMount(p string) bool {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[1] == p && f[2] == "9p" {
			return true
		}
	}
	return false
}

// virtioFSRoot is where the agent mounts the virtio-fs device; each smx
// mount is a bind of one of its directories.
const virtioFSRoot = "/run/smx/virtiofs"

// bindVirtioFS mounts the virtio-fs device (once) and binds the mount's
// directory of it at m.Path.
func bindVirtioFS(m *agentproto.MountRequest) error {
	if !shareTag().MatchString(m.VirtioFS) {
		return errors.New("guest: mount: bad virtio-fs tag")
	}
	if !isMountOf(virtioFSRoot, "virtiofs") {
		if err := os.MkdirAll(virtioFSRoot, 0o700); err != nil {
			return fmt.Errorf("guest: mount: %w", err)
		}
		if err := unix.Mount(m.VirtioFS, virtioFSRoot, "virtiofs", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("guest: mount virtio-fs %s on %s: %w", m.VirtioFS, virtioFSRoot, err)
		}
	}
	if _, err := os.Lstat(m.Path); errors.Is(err, os.ErrNotExist) {
		madeMountPoints.Store(m.Path, true)
	}
	if err := os.MkdirAll(m.Path, 0o755); err != nil {
		return fmt.Errorf("guest: mount: %w", err)
	}
	src := virtioFSRoot + "/" + m.Tag
	if err := unix.Mount(src, m.Path, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("guest: bind %s on %s: %w", src, m.Path, err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
	if m.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", m.Path, "", flags, ""); err != nil {
		unix.Unmount(m.Path, unix.MNT_DETACH)
		return fmt.Errorf("guest: remount %s: %w", m.Path, err)
	}
	return nil
}

// madeMountPoints are the mount points bindVirtioFS made (keys: paths),
// which unbindVirtioFS removes again.
var madeMountPoints sync.Map

// unbindVirtioFS detaches the virtio-fs bind at m.Path. It is lazy
// (MNT_DETACH): a busy mount leaves the guest's tree at once, and what a
// process still holds in it fails as soon as the host drops the mount's
// tree. A symlink at m.Path is not followed.
func unbindVirtioFS(w io.Writer, m *agentproto.MountRequest) error {
	if m == nil || !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path || m.Path == "/" {
		return errors.New("guest: unmount: not an absolute, clean path other than /")
	}
	if !isMountOf(m.Path, "virtiofs") {
		return fmt.Errorf("guest: unmount: no smx mount at %s", m.Path)
	}
	if err := unix.Unmount(m.Path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
		return fmt.Errorf("guest: unmount %s: %w", m.Path, err)
	}
	if _, made := madeMountPoints.LoadAndDelete(m.Path); made && !isMountOf(m.Path, "virtiofs") {
		os.Remove(m.Path) // only if empty; a directory the image had stays
	}
	return agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true})
}

// isMountOf reports whether p is a mount point of file system type fs.
func isMountOf(p, fs string) bool {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[1] == p && f[2] == fs {
			return true
		}
	}
	return false
}

// mountOverlay mounts at m.Overlay an overlay of the read-only share at
// m.Path under a writable layer on the guest's disk, owned by m.UID:m.GID,
// so that the guest uses a read-only cache as a normal folder. After a
// restore the overlay is mounted already and is left as it is.
func mountOverlay(m *agentproto.MountRequest) error {
	if !path.IsAbs(m.Overlay) || path.Clean(m.Overlay) != m.Overlay || m.Overlay == "/" || m.Overlay == m.Path {
		return fmt.Errorf("guest: mount: overlay %q is not an absolute, clean path other than / and the share", m.Overlay)
	}
	if isMountOf(m.Overlay, "overlay") {
		return nil
	}
	upper := agentproto.OverlayUpper(m.Tag)
	work := path.Dir(upper) + "/work"
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("guest: mount overlay: %w", err)
		}
	}
	if err := os.Chown(upper, int(m.UID), int(m.GID)); err != nil {
		return fmt.Errorf("guest: mount overlay: %w", err)
	}
	if err := mkdirOwned(m.Overlay, int(m.UID), int(m.GID)); err != nil {
		return fmt.Errorf("guest: mount overlay: %w", err)
	}
	// A module the boot did not load (a restored boot template) is
	// loaded now.
	_ = LoadKept() // a kernel without overlay fails the mount below, which says so
	opts := "lowerdir=" + m.Path + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("smx-cache-"+m.Tag, m.Overlay, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("guest: mount overlay on %s: %w", m.Overlay, err)
	}
	return nil
}

// mkdirOwned makes dir and the parents it lacks, the new ones owned by
// uid:gid (a cache under a user's home belongs to that user, as do
// ~/.cache and ~/go made for it).
func mkdirOwned(dir string, uid, gid int) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if err := mkdirOwned(path.Dir(dir), uid, gid); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	return os.Chown(dir, uid, gid)
}
