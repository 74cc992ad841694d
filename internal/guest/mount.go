package guest

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Mount is one filesystem to mount.
type Mount struct {
	Source, Target, FSType string
	Flags                  uintptr
	Data                   string
	// Required mounts stop the boot when they fail.
	Required bool
}

func (m Mount) String() string {
	return fmt.Sprintf("%s on %s type %s (%s)", m.Source, m.Target, m.FSType, m.Data)
}

const nosuidNodevNoexec = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC

// earlyMounts are what the initramfs needs to load modules and find the
// root device.
var earlyMounts = []Mount{
	{Source: "proc", Target: "/proc", FSType: "proc", Flags: nosuidNodevNoexec, Required: true},
	{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: nosuidNodevNoexec, Required: true},
	{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: unix.MS_NOSUID, Data: "mode=0755", Required: true},
}

// rootMounts are what programs expect in a running system. /proc, /sys and
// /dev are normally already there (moved over from the initramfs) and are
// then skipped.
var rootMounts = []Mount{
	{Source: "proc", Target: "/proc", FSType: "proc", Flags: nosuidNodevNoexec, Required: true},
	{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: nosuidNodevNoexec, Required: true},
	{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: unix.MS_NOSUID, Data: "mode=0755", Required: true},
	// gid 5 is "tty" on Debian and busybox images alike.
	{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "newinstance,ptmxmode=0666,mode=0620,gid=5", Required: true},
	{Source: "shm", Target: "/dev/shm", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
	{Source: "tmpfs", Target: "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755"},
	{Source: "cgroup2", Target: "/sys/fs/cgroup", FSType: "cgroup2", Flags: nosuidNodevNoexec},
}

// Mounts mounts a list of filesystems, creating the mount points and
// skipping those already mounted.
type Mounts struct {
	Label string
	List  []Mount
}

func (m Mounts) String() string { return "mount " + m.Label + " filesystems" }

func (m Mounts) Run(b *Boot) error {
	for _, mt := range m.List {
		if err := mountOnce(mt); err != nil {
			if mt.Required {
				return err
			}
			b.Log.Warn("mount failed", "target", mt.Target, "err", err)
		}
	}
	return nil
}

func mountOnce(m Mount) error {
	if mounted, _ := isMountPoint(m.Target); mounted {
		return nil
	}
	if err := os.MkdirAll(m.Target, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", m.Target, err)
	}
	if err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data); err != nil {
		return fmt.Errorf("mount %s: %w", m, err)
	}
	return nil
}

// isMountPoint reports whether path is listed in /proc/self/mountinfo.
func isMountPoint(path string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountPath(fields[4]) == path {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMountPath undoes the octal escapes (\040 for space) in mountinfo.
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range []byte(s[i+1 : i+4]) {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ConsoleFDs points stdin, stdout and stderr at /dev/console. Without a
// /dev/console node in the initramfs the kernel starts init with no open
// descriptors and the Go runtime puts /dev/null there, which would hide
// every log line.
type ConsoleFDs struct{}

func (ConsoleFDs) String() string { return "attach console" }

func (ConsoleFDs) Run(b *Boot) error {
	var st unix.Stat_t
	if err := unix.Fstat(1, &st); err == nil && st.Rdev == unix.Mkdev(5, 1) {
		return nil
	}
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil // nowhere better to log to
	}
	for i := 0; i < 3; i++ {
		_ = unix.Dup3(fd, i, 0)
	}
	if fd > 2 {
		unix.Close(fd)
	}
	return nil
}

// DevLinks adds the /dev symlinks that devtmpfs does not create and that
// shells and libcs rely on.
type DevLinks struct{}

func (DevLinks) String() string { return "create /dev links" }

func (DevLinks) Run(b *Boot) error {
	links := [][2]string{
		{"/proc/self/fd", "/dev/fd"},
		{"/proc/self/fd/0", "/dev/stdin"},
		{"/proc/self/fd/1", "/dev/stdout"},
		{"/proc/self/fd/2", "/dev/stderr"},
		{"/proc/kcore", "/dev/core"},
		{"pts/ptmx", "/dev/ptmx"},
	}
	for _, l := range links {
		if _, err := os.Lstat(l[1]); err == nil {
			continue
		}
		if err := os.Symlink(l[0], l[1]); err != nil {
			b.Log.Warn("symlink failed", "link", l[1], "err", err)
		}
	}
	return nil
}

// SwitchRoot mounts the root device named by smx.root (ext4, read-write)
// and makes it the root, the way switch_root does: move the API
// filesystems into it, free the initramfs, move it over /, chroot. Without
// smx.root the initramfs stays the root.
type SwitchRoot struct {
	Dir  string        // where the new root is mounted first
	Wait time.Duration // how long to wait for the device to appear
}

func (s SwitchRoot) String() string { return "switch root to " + s.Dir }

func (s SwitchRoot) Run(b *Boot) error {
	dev := b.Cmdline.Root
	if dev == "" {
		b.Log.Debug("no smx.root; staying on the initramfs")
		return nil
	}
	deadline := time.Now().Add(s.Wait)
	for {
		if _, err := os.Stat(dev); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("root device %s did not appear within %s (is virtio_blk in /etc/smx/modules and the disk attached?)", dev, s.Wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, s.Dir, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount %s on %s as ext4: %w", dev, s.Dir, err)
	}
	for _, api := range []string{"/dev", "/proc", "/sys"} {
		target := filepath.Join(s.Dir, api)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(api, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s to %s: %w", api, target, err)
		}
	}
	if err := freeInitramfs(s.Dir); err != nil {
		b.Log.Warn("could not free the initramfs", "err", err)
	}
	if err := unix.Chdir(s.Dir); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move %s to /: %w", s.Dir, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

// freeInitramfs deletes the initramfs contents (which live in RAM) except
// keep, as switch_root does. It only acts when / really is a ramfs or
// tmpfs, so a mistake can never delete a disk.
func freeInitramfs(keep string) error {
	var fs unix.Statfs_t
	if err := unix.Statfs("/", &fs); err != nil {
		return err
	}
	if fs.Type != unix.RAMFS_MAGIC && fs.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("/ is not a ramfs (type %#x); leaving it", fs.Type)
	}
	var rootSt unix.Stat_t
	if err := unix.Lstat("/", &rootSt); err != nil {
		return err
	}
	entries, err := os.ReadDir("/")
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := "/" + e.Name()
		if p == keep {
			continue
		}
		if err := removeSameDev(p, rootSt.Dev); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeSameDev removes p recursively without crossing into other mounts.
func removeSameDev(p string, dev uint64) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err
	}
	if st.Dev != dev {
		return nil
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		entries, err := os.ReadDir(p)
		if err != nil {
			return err
		}
		for _, e := range entries {
			if err := removeSameDev(filepath.Join(p, e.Name()), dev); err != nil {
				return err
			}
		}
	}
	return os.Remove(p)
}
