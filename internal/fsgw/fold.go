package fsgw

import (
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Host folders that compare names case-insensitively. On a vfat stick, an
// exFAT or NTFS disk, an SMB share, or in an ext4, f2fs or tmpfs directory
// with the casefold attribute (`chattr +F`), `.ENV` is the host's `.env`:
// a rule that denies `/work/.env` must refuse `.ENV` as well, and a rule
// that freezes `.envrc` must refuse the creation of `.EnvRC`, which the
// host's direnv would read as `.envrc`. So where the host folds case, the
// gateway decides with policy.FileMount.FoldCase (rules match whatever the
// case, and the stricter of the case-sensitive and the folded decision
// holds).
//
// Where the host folds is found out, not configured:
//   - a file system that folds everywhere by its type (vfat, exFAT, NTFS,
//     HFS+, SMB/CIFS; the last may not fold, then folding only refuses
//     more), or, for any other type, a probe at the mount's root: an entry
//     whose name with its letters' case swapped leads to the same inode
//     (ZFS with casesensitivity=insensitive, a FUSE folder); until a root
//     entry has a letter to try, the probe is repeated at most every
//     foldRecheck;
//   - on a file system that can fold single directories (ext4, f2fs,
//     tmpfs, when the running kernel can: /sys/fs/TYPE/features/casefold),
//     each directory's casefold attribute (FS_IOC_GETFLAGS), checked for
//     every directory above a decided name and kept for foldRecheck (and
//     forgotten when the guest renames or removes a directory). The
//     attribute can be set only on an empty directory and is inherited by
//     what is made in it.
//
// Folding compares names as the host's casefold does or more loosely
// (policy.foldName), so it can only refuse more.
const (
	foldRecheck = 5 * time.Second
	foldDirsMax = 4096

	casefoldFlag = 0x40000000 // FS_CASEFOLD_FL
	hfsplusMagic = 0x482b
	ntfsMagic    = 0x7366746e
	smbMagic     = 0x517b
)

type foldState struct {
	all    atomic.Bool // every name in the mount compares case-insensitively
	known  atomic.Bool // all is settled (by type or a conclusive probe)
	perDir bool        // directories may fold one by one (casefold attribute)

	mu      sync.Mutex
	probeAt time.Time
	dirs    map[string]foldDir // by path relative to the root
}

type foldDir struct {
	fold bool
	at   time.Time
}

// initFold sets how the mount's file system compares names.
func (g *Gateway) initFold() {
	var s unix.Statfs_t
	if err := unix.Fstatfs(g.rootFD, &s); err != nil {
		return
	}
	switch uint32(s.Type) {
	case unix.MSDOS_SUPER_MAGIC, unix.EXFAT_SUPER_MAGIC, hfsplusMagic, ntfsMagic,
		unix.CIFS_SUPER_MAGIC, unix.SMB2_SUPER_MAGIC, smbMagic:
		g.fold.all.Store(true)
		g.fold.known.Store(true)
		return
	case unix.EXT4_SUPER_MAGIC:
		g.fold.perDir = kernelCasefolds("ext4")
	case unix.F2FS_SUPER_MAGIC:
		g.fold.perDir = kernelCasefolds("f2fs")
	case unix.TMPFS_MAGIC:
		g.fold.perDir = kernelCasefolds("tmpfs")
	}
	if g.fold.perDir {
		// Per directory, or not at all: the probe would only see the
		// root's attribute, which dirFolds reads.
		g.fold.known.Store(true)
		return
	}
	g.probeFold()
}

// kernelCasefolds reports whether the running kernel can fold names in
// file systems of type fs.
func kernelCasefolds(fs string) bool {
	_, err := os.Stat("/sys/fs/" + fs + "/features/casefold")
	return err == nil
}

// probeFold looks for a root entry with a letter and asks the host for it
// in the other case. Called without g.fold.mu.
func (g *Gateway) probeFold() {
	fd, err := g.openat(".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	ents, err := readNames(fd)
	if err != nil {
		return
	}
	for _, e := range ents {
		other := swapCase(e.name)
		if other == e.name {
			continue
		}
		var a, b unix.Stat_t
		if unix.Fstatat(fd, e.name, &a, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		err := unix.Fstatat(fd, other, &b, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil && err != unix.ENOENT {
			continue
		}
		g.fold.all.Store(err == nil && a.Ino == b.Ino && a.Dev == b.Dev)
		g.fold.known.Store(true)
		return
	}
}

// swapCase swaps the case of ASCII letters.
func swapCase(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z':
			b[i] = c - 'a' + 'A'
		case c >= 'A' && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
	}
	return string(b)
}

// folds reports whether the host compares the name at guest path p
// case-insensitively: the whole mount does, or a directory above it.
func (g *Gateway) folds(p string) bool {
	if g.fold.all.Load() {
		return true
	}
	if !g.fold.known.Load() {
		g.fold.mu.Lock()
		due := time.Since(g.fold.probeAt) > foldRecheck
		if due {
			g.fold.probeAt = time.Now()
		}
		g.fold.mu.Unlock()
		if due {
			g.probeFold()
			if g.fold.all.Load() {
				return true
			}
		}
	}
	if !g.fold.perDir {
		return false
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(p, g.cfg.Mount.Guest), "/")
	if g.dirFolds(".") {
		return true
	}
	for i := 0; i < len(rel); i++ {
		if rel[i] == '/' && g.dirFolds(rel[:i]) {
			return true
		}
	}
	return false
}

// dirFolds reports whether directory rel has the casefold attribute.
func (g *Gateway) dirFolds(rel string) bool {
	g.fold.mu.Lock()
	d, ok := g.fold.dirs[rel]
	g.fold.mu.Unlock()
	if ok && time.Since(d.at) < foldRecheck {
		return d.fold
	}
	fd, err := g.openat(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false // not a directory (yet): nothing below it to decide
	}
	flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
	unix.Close(fd)
	fold := err == nil && flags&casefoldFlag != 0
	g.fold.mu.Lock()
	if g.fold.dirs == nil || len(g.fold.dirs) >= foldDirsMax {
		g.fold.dirs = map[string]foldDir{}
	}
	g.fold.dirs[rel] = foldDir{fold: fold, at: time.Now()}
	g.fold.mu.Unlock()
	return fold
}

// forgetDirs drops what dirFolds knows, after the guest renamed or removed
// a directory (paths now name other directories).
func (g *Gateway) forgetDirs() {
	g.fold.mu.Lock()
	g.fold.dirs = nil
	g.fold.mu.Unlock()
}
