package guest

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// GrowRoot grows the root ext4 filesystem online to fill its block device.
// Images are built just large enough for their content; a sandbox's disk
// is a larger copy-on-write overlay (`--disk`), and this step is what makes
// that space usable. It is a no-op once the filesystem fills the device.
type GrowRoot struct{}

func (GrowRoot) String() string { return "grow root filesystem to the disk size" }

// ext4IocResizeFS is EXT4_IOC_RESIZE_FS, _IOW('f', 16, __u64).
const ext4IocResizeFS = 0x40086610

func (GrowRoot) Run(b *Boot) error {
	dev := b.Cmdline.Root
	if dev == "" {
		return nil
	}
	f, err := os.Open(dev)
	if err != nil {
		b.Log.Warn("grow root: open device", "err", err)
		return nil
	}
	size, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
	f.Close()
	if err != nil {
		b.Log.Warn("grow root: device size", "err", err)
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err != nil {
		b.Log.Warn("grow root: statfs", "err", err)
		return nil
	}
	bs := uint64(st.Bsize)
	want := size / bs
	if want <= st.Blocks+bs { // already fills it (statfs excludes overhead)
		return nil
	}
	root, err := os.Open("/")
	if err != nil {
		return nil
	}
	defer root.Close()
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, root.Fd(), ext4IocResizeFS, uintptr(unsafe.Pointer(&want)))
	if errno != 0 && errno != unix.EINVAL {
		// A filesystem that cannot grow still boots; the user just has
		// the image's size.
		b.Log.Warn("grow root", "err", fmt.Errorf("EXT4_IOC_RESIZE_FS to %d blocks: %w", want, errno))
	}
	return nil
}
