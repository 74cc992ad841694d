package fsgw

import (
	"path"
	"strconv"
	"strings"

	"github.com/hugelgupf/p9/linux"
	"golang.org/x/sys/unix"
)

// Symlinks the guest makes, moves or links must never lead outside the
// mount on the host, where users and tools (an IDE, a backup, `smx agent
// cp`, the shim) follow them. A target is relative and of the form
//
//	../../name/name/...
//
// every `..` first, no more of them than the link's directory lies below
// the mount's root, and no `..` after a name (`.` and empty elements are
// ignored). Then, resolved on the host, the `..`s climb real directories
// (the link's own directory and its parents are directories inside the
// mount, never symlinks) and stop at the root at the highest; each name
// after them leads down, and if it is itself a symlink, that one obeys the
// same rule where it lies, so it leads to a place inside the mount too. So
// by induction no chain of such links leaves the mount, whatever they are
// renamed to later, as long as every rename and link keeps the rule, which
// RenameAt and Link check (for a moved directory, on every symlink inside
// it). A `..` after a name is refused because that name may be, or later
// become, a symlink to a shallower place, from which the `..` climbs out
// (`a/b/l -> c/../../x`, then `a/b/c -> ..`). A target that leaves the
// root even for a moment (`../work/x` from the root of a mount the guest
// sees as /work) is refused as well: where it lands depends on the host
// folder's own name and what lies beside it.
//
// Symlinks the host already has are the host's: the gateway never follows
// any, and does not judge them, until the guest moves or links one (then
// it must obey the rule at its new place).

// checkTarget decides a symlink target for a link in directory dir
// (relative to the mount's root). It returns the guest path the target
// names, or the reason it is refused and the errno for the guest.
func (g *Gateway) checkTarget(dir, target string) (dest, reason string, errno linux.Errno) {
	if target == "" || strings.IndexByte(target, 0) >= 0 || len(target) > 4095 {
		return "", "target " + strconv.Quote(target) + " is empty, too long or holds a NUL", linux.EINVAL
	}
	if path.IsAbs(target) {
		return "", "target " + strconv.Quote(target) + " is absolute; on the host it would name a host path", linux.EPERM
	}
	depth := 0
	if dir != "." {
		depth = strings.Count(dir, "/") + 1
	}
	up, named := 0, false
	for _, el := range strings.Split(target, "/") {
		switch {
		case el == "" || el == ".":
		case el == "..":
			if named {
				return "", "target " + strconv.Quote(target) + " has .. after a name: on the host that name may be a symlink, from whose end .. climbs elsewhere; write it as ../…/name", linux.EPERM
			}
			if up++; up > depth {
				return "", "target " + strconv.Quote(target) + " climbs above the mount's root (at " + g.guestPath(dir) + ") and would lead outside the mount on the host", linux.EPERM
			}
		default:
			named = true
		}
	}
	dest = path.Join(g.guestPath(dir), target)
	if !g.visible(dest) {
		return dest, "target " + strconv.Quote(target) + " leads to denied path " + dest, linux.EACCES
	}
	return dest, "", 0
}

// symlinkFits checks symlink name in directory fd for a new place, as
// newName in directory dir (relative to the mount's root): "" when its
// target obeys the rule there, else why not.
func (g *Gateway) symlinkFits(fd int, name, dir, newName string) (reason string, errno linux.Errno) {
	target, err := readlinkAt(fd, name)
	if err != nil {
		return "cannot read the symlink: " + err.Error(), linux.EIO
	}
	if _, reason, errno := g.checkTarget(dir, target); reason != "" {
		return "as " + g.guestPath(join(dir, newName)) + ", symlink " + reason, errno
	}
	return "", 0
}

// readlinkAt reads the target of symlink name in directory fd.
func readlinkAt(fd int, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(fd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
