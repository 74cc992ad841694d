package cli

import (
	"fmt"

	"golang.org/x/sys/unix"

	"smx/internal/errdefs"
	"smx/internal/image"
)

// checkDisk validates a root disk size against what the image and the host
// can give. The disk is a sparse copy-on-write overlay, but the guest grows
// its filesystem to the size asked for: smaller than the image cannot hold
// it, and larger than the host's free space promises room that is not
// there (at 100T the guest's resize even overflowed). The default size is
// raised to the image's when the image is larger.
func (e *env) checkDisk(f *createFlags, disk int64, img *image.Image) (int64, error) {
	given := f.set != nil && f.set("disk")
	if disk < img.Size {
		if !given {
			return img.Size, nil
		}
		return 0, fmt.Errorf("invalid --disk %s: image %s needs at least %s: %w", f.disk, img.Name, humanBytes(img.Size), errdefs.ErrInvalid)
	}
	if !given {
		return disk, nil
	}
	if err := e.state.Ensure(); err != nil {
		return 0, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(e.state.Root, &st); err == nil {
		if free := int64(st.Bavail) * st.Bsize; disk > free {
			return 0, fmt.Errorf("invalid --disk %s: only %s is free under %s: %w", f.disk, humanBytes(free), e.state.Root, errdefs.ErrInvalid)
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
		return fmt.Errorf("invalid --memory %s: the host has %s of RAM: %w", flag, humanBytes(total), errdefs.ErrInvalid)
	}
	return nil
}
