package fsgw

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// file is one 9P fid: a name under its parent directory's fid, so that a
// rename the p9 server reports (Renamed) moves every fid below it too.
// Until Open or Create it holds no descriptor: every operation resolves its
// path again from the root, with no symlink followed, and decides it.
//
// The p9 server serialises operations as its File contract says (walks and
// reads against renames and creates), so the parent chain is stable during
// any one call.
type file struct {
	g      *Gateway
	parent *file // nil for the mount root
	name   string

	fd      *os.File // after Open/Create
	write   bool     // opened for writing
	linked  bool     // a regular file with several links when opened: see checkLinks
	lockFD  *os.File // read-write descriptor for write locks on a read-only open
	dirents []p9.Dirent
	// granted is the rule of the host user's answer that let this
	// descriptor open (a files rule that asks): the reads and writes
	// through it are not asked again (see ask.go).
	granted string
}

// rel is the path relative to the mount root: "." or "a/b".
func (f *file) rel() string {
	if f.parent == nil {
		return "."
	}
	var parts []string
	for x := f; x.parent != nil; x = x.parent {
		parts = append(parts, x.name)
	}
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	return strings.Join(parts, "/")
}

func (f *file) guest() string { return f.g.guestPath(f.rel()) }

func (f *file) child(name string) *file { return &file{g: f.g, parent: f, name: name} }

// qid builds the 9P identity of a stat result.
func qid(st *unix.Stat_t) p9.QID {
	return p9.QID{Type: p9.FileMode(st.Mode).QIDType(), Path: st.Ino}
}

// Walk implements p9.File.
func (f *file) Walk(names []string) ([]p9.QID, p9.File, error) {
	if len(names) == 0 {
		if err := f.g.check("walk", f.guest(), "ro"); err != nil {
			return nil, nil, err
		}
		st, err := f.g.lstat(f.rel())
		if err != nil {
			return nil, nil, err
		}
		return []p9.QID{qid(&st)}, &file{g: f.g, parent: f.parent, name: f.name}, nil
	}
	qids, cur, _, err := f.walk(names)
	if err != nil {
		return nil, nil, err
	}
	return qids, cur, nil
}

// walk walks names (at least one) and returns the last one's stat too.
func (f *file) walk(names []string) ([]p9.QID, *file, unix.Stat_t, error) {
	qids := make([]p9.QID, 0, len(names))
	cur := f
	var st unix.Stat_t
	for _, n := range names {
		if err := checkName(n); err != nil {
			return nil, nil, st, err
		}
		next := cur.child(n)
		if err := f.g.check("walk", next.guest(), "ro"); err != nil {
			return nil, nil, st, err
		}
		var err error
		if st, err = f.g.lstat(next.rel()); err != nil {
			return nil, nil, st, err
		}
		qids = append(qids, qid(&st))
		cur = next
	}
	return qids, cur, st, nil
}

// WalkGetAttr implements p9.File: a walk and the attributes of where it
// ends with one decision and one lstat per name. GetAttr would decide the
// same path for reading again, which the walk has just allowed; virtio-fs
// answers every LOOKUP with both.
func (f *file) WalkGetAttr(names []string) ([]p9.QID, p9.File, p9.AttrMask, p9.Attr, error) {
	if len(names) == 0 {
		qids, nf, err := f.Walk(nil)
		if err != nil {
			return nil, nil, p9.AttrMask{}, p9.Attr{}, err
		}
		_, valid, attr, err := nf.GetAttr(p9.AttrMaskAll)
		if err != nil {
			return nil, nil, p9.AttrMask{}, p9.Attr{}, err
		}
		return qids, nf, valid, attr, nil
	}
	qids, cur, st, err := f.walk(names)
	if err != nil {
		return nil, nil, p9.AttrMask{}, p9.Attr{}, err
	}
	valid, attr := f.g.attrOf(&st)
	return qids, cur, valid, attr, nil
}

// StatFS implements p9.File.
func (f *file) StatFS() (p9.FSStat, error) {
	var s unix.Statfs_t
	if err := unix.Fstatfs(f.g.rootFD, &s); err != nil {
		return p9.FSStat{}, err
	}
	return p9.FSStat{
		Type: uint32(s.Type), BlockSize: uint32(s.Bsize), Blocks: s.Blocks, BlocksFree: s.Bfree,
		BlocksAvailable: s.Bavail, Files: s.Files, FilesFree: s.Ffree,
		FSID: uint64(uint32(s.Fsid.Val[0])) | uint64(uint32(s.Fsid.Val[1]))<<32, NameLength: uint32(s.Namelen),
	}, nil
}

// GetAttr implements p9.File.
func (f *file) GetAttr(req p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	if err := f.g.check("getattr", f.guest(), "ro"); err != nil {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, err
	}
	var st unix.Stat_t
	var err error
	if f.fd != nil {
		err = unix.Fstat(int(f.fd.Fd()), &st)
	} else {
		st, err = f.g.lstat(f.rel())
	}
	if err != nil {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, err
	}
	valid, attr := f.g.attrOf(&st)
	return qid(&st), valid, attr, nil
}

// attrOf is a stat result as the guest sees it (owners mapped).
func (g *Gateway) attrOf(st *unix.Stat_t) (p9.AttrMask, p9.Attr) {
	uid, gid := g.guestIDs(st.Uid, st.Gid)
	attr := p9.Attr{
		Mode: p9.FileMode(st.Mode), UID: p9.UID(uid), GID: p9.GID(gid), NLink: p9.NLink(st.Nlink),
		RDev: p9.Dev(st.Rdev), Size: uint64(st.Size), BlockSize: uint64(st.Blksize), Blocks: uint64(st.Blocks),
		ATimeSeconds: uint64(st.Atim.Sec), ATimeNanoSeconds: uint64(st.Atim.Nsec),
		MTimeSeconds: uint64(st.Mtim.Sec), MTimeNanoSeconds: uint64(st.Mtim.Nsec),
		CTimeSeconds: uint64(st.Ctim.Sec), CTimeNanoSeconds: uint64(st.Ctim.Nsec),
	}
	valid := p9.AttrMask{Mode: true, NLink: true, UID: true, GID: true, RDev: true, ATime: true,
		MTime: true, CTime: true, INo: true, Size: true, Blocks: true}
	return valid, attr
}

// SetAttr implements p9.File. Files stay owned by the host user running
// the sandbox: a change of owner or group to the mount's guest owner is a
// no-op, to anyone else EPERM. Set-user-ID and set-group-ID bits are
// dropped.
func (f *file) SetAttr(valid p9.SetAttrMask, attr p9.SetAttr) error {
	p := f.guest()
	if valid.UID || valid.GID {
		if err := f.g.checkFor("setattr", p, "rw", f); err != nil {
			return err
		}
		if valid.UID && uint32(attr.UID) != f.g.cfg.Owner.UID || valid.GID && uint32(attr.GID) != f.g.cfg.Owner.GID {
			return f.g.refuse("chown", p, fmt.Sprintf("chown to %d:%d: files in the mount belong to the host user (%d:%d in the guest)",
				attrID(valid.UID, uint32(attr.UID)), attrID(valid.GID, uint32(attr.GID)), f.g.cfg.Owner.UID, f.g.cfg.Owner.GID), linux.EPERM)
		}
	}
	if valid.Permissions || valid.Size || valid.ATime || valid.MTime {
		if err := f.g.checkFor("setattr", p, "rw", f); err != nil {
			return err
		}
	}
	if valid.Size {
		if err := f.truncate(int64(attr.Size)); err != nil {
			return err
		}
	}
	if valid.Permissions {
		if err := f.chmod(uint32(attr.Permissions) & 0o1777); err != nil {
			return err
		}
	}
	if valid.ATime || valid.MTime {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if valid.ATime {
			ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
			if valid.ATimeNotSystemTime {
				ts[0] = unix.Timespec{Sec: int64(attr.ATimeSeconds), Nsec: int64(attr.ATimeNanoSeconds)}
			}
		}
		if valid.MTime {
			ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
			if valid.MTimeNotSystemTime {
				ts[1] = unix.Timespec{Sec: int64(attr.MTimeSeconds), Nsec: int64(attr.MTimeNanoSeconds)}
			}
		}
		if f.parent == nil {
			return unix.UtimesNanoAt(f.g.rootFD, ".", ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		dfd, err := f.g.dirFD(f.parent.rel())
		if err != nil {
			return err
		}
		defer unix.Close(dfd)
		return unix.UtimesNanoAt(dfd, f.name, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

// attrID is id as chown(1) would print it: -1 when it is not changed.
func attrID(set bool, id uint32) int64 {
	if !set {
		return -1
	}
	return int64(id)
}

// guestIDs maps a host uid and gid to the guest's (see Gateway).
func (g *Gateway) guestIDs(uid, gid uint32) (uint32, uint32) {
	gu, gg := uint32(Nobody), uint32(Nobody)
	if uid == g.uid {
		gu = g.cfg.Owner.UID
	}
	if gid == g.gid {
		gg = g.cfg.Owner.GID
	}
	return gu, gg
}

// giveAway hands an inode the gateway just made (fd, stated as st) to the
// host user when the gateway runs as root for another user (Gateway.chown).
// It acts only on what root owns with a single link (so never on a file
// that also has a name outside the mount), through the descriptor, never
// a path, and only ever to that one user; st is updated.
func (g *Gateway) giveAway(fd int, st *unix.Stat_t) error {
	if !g.chown {
		return nil
	}
	if err := unix.Fstat(fd, st); err != nil {
		return err
	}
	if st.Uid != 0 || st.Nlink != 1 && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil
	}
	if err := unix.Fchownat(fd, "", int(g.uid), int(g.gid), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	return unix.Fstat(fd, st)
}

func (f *file) truncate(size int64) error {
	if f.fd != nil && f.write {
		if err := f.g.checkLinksFD("truncate", f.rel(), int(f.fd.Fd()), "rw"); err != nil {
			return err
		}
		return unix.Ftruncate(int(f.fd.Fd()), size)
	}
	fd, _, err := f.g.openNode(f.rel(), unix.O_WRONLY, func(st *unix.Stat_t) error {
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return linux.EINVAL
		}
		return f.g.checkLinks("truncate", f.rel(), st, "rw")
	})
	if err == errNotFile || err == errSymlink {
		return linux.EINVAL
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Ftruncate(fd, size)
}

// chmod goes through an O_PATH descriptor and /proc/self/fd, so it acts on
// the very inode resolved without symlinks; on a symlink it fails rather
// than follow it.
func (f *file) chmod(mode uint32) error {
	fd, err := f.g.openat(f.rel(), unix.O_PATH|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
		return linux.EOPNOTSUPP
	}
	if t := st.Mode & unix.S_IFMT; t == unix.S_IFREG {
		mode &= 0o777
	}
	if err := f.g.checkLinks("chmod", f.rel(), &st, "rw"); err != nil {
		return err
	}
	return unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), mode)
}

// Close implements p9.File.
func (f *file) Close() error {
	if f.fd != nil {
		f.fd.Close()
		f.fd = nil
	}
	if f.lockFD != nil {
		f.lockFD.Close()
		f.lockFD = nil
	}
	return nil
}

// Open implements p9.File. Only regular files and directories open: a
// FIFO, socket or device that the host has in the folder is refused, and
// never opened on the host (see openNode).
func (f *file) Open(mode p9.OpenFlags) (p9.QID, uint32, error) {
	q, n, err := f.open(mode)
	if err != nil {
		f.granted = "" // an answer covers an open that happened only
	}
	return q, n, err
}

func (f *file) open(mode p9.OpenFlags) (p9.QID, uint32, error) {
	access := "ro"
	if mode.Mode() != p9.ReadOnly {
		access = "rw"
	}
	if err := f.g.checkFor("open", f.guest(), access, f); err != nil {
		return p9.QID{}, 0, err
	}
	flags := int(mode.Mode()) | int(uint32(mode)&unix.O_APPEND)
	fd, st, err := f.g.openNode(f.rel(), flags, func(st *unix.Stat_t) error {
		return f.g.checkLinks("open", f.rel(), st, access)
	})
	switch err {
	case nil:
	case errSymlink:
		return p9.QID{}, 0, linux.ELOOP
	case errNotFile:
		return p9.QID{}, 0, f.g.refuse("open", f.guest(), "not a regular file or directory", linux.EPERM)
	default:
		return p9.QID{}, 0, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, flags&unix.O_APPEND); err != nil {
		unix.Close(fd)
		return p9.QID{}, 0, err
	}
	f.fd = os.NewFile(uintptr(fd), f.rel())
	f.write = access == "rw"
	f.linked = st.Mode&unix.S_IFMT == unix.S_IFREG && st.Nlink > 1
	return qid(&st), 0, nil
}

// ReadAt implements p9.File; the read is decided again, so a profile
// change reaches files already open.
func (f *file) ReadAt(p []byte, off int64) (int, error) {
	return f.ReadVecAt([][]byte{p}, off)
}

// ReadVecAt is ReadAt into several buffers, with one decision and one
// preadv: the virtio-fs server reads straight into the guest's pages.
func (f *file) ReadVecAt(bufs [][]byte, off int64) (int, error) {
	if f.fd == nil {
		return 0, linux.EBADF
	}
	if err := f.g.checkFor("read", f.guest(), "ro", f); err != nil {
		return 0, linux.EACCES
	}
	if f.linked {
		if err := f.g.checkLinksFD("read", f.rel(), int(f.fd.Fd()), "ro"); err != nil {
			return 0, linux.EACCES
		}
	}
	var n int
	var err error
	if len(bufs) == 1 {
		n, err = unix.Pread(int(f.fd.Fd()), bufs[0], off)
	} else {
		n, err = unix.Preadv(int(f.fd.Fd()), bufs, off)
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}

// WriteAt implements p9.File.
func (f *file) WriteAt(p []byte, off int64) (int, error) {
	return f.WriteVecAt([][]byte{p}, off)
}

// WriteVecAt is WriteAt from several buffers, with one decision and one
// pwritev.
func (f *file) WriteVecAt(bufs [][]byte, off int64) (int, error) {
	if f.fd == nil || !f.write {
		return 0, linux.EBADF
	}
	if err := f.g.checkFor("write", f.guest(), "rw", f); err != nil {
		return 0, err
	}
	if f.linked {
		if err := f.g.checkLinksFD("write", f.rel(), int(f.fd.Fd()), "rw"); err != nil {
			return 0, err
		}
	}
	var n int
	var err error
	if len(bufs) == 1 {
		n, err = unix.Pwrite(int(f.fd.Fd()), bufs[0], off)
	} else {
		n, err = unix.Pwritev(int(f.fd.Fd()), bufs, off)
	}
	if err != nil {
		return 0, err
	}
	return n, nil
}

// FSync implements p9.File.
func (f *file) FSync() error {
	if f.fd == nil {
		return nil
	}
	return f.fd.Sync()
}

// Lock implements p9.File with open file description locks, so locks
// belong to the guest's open file, as fcntl locks on the host would.
func (f *file) Lock(pid int, typ p9.LockType, flags p9.LockFlags, start, length uint64, client string) (p9.LockStatus, error) {
	if f.fd == nil {
		return p9.LockStatusError, linux.EBADF
	}
	lk := unix.Flock_t{Whence: 0, Start: int64(start), Len: int64(length)}
	switch typ {
	case p9.ReadLock:
		lk.Type = unix.F_RDLCK
	case p9.WriteLock:
		lk.Type = unix.F_WRLCK
	case p9.Unlock:
		lk.Type = unix.F_UNLCK
	default:
		return p9.LockStatusError, linux.EINVAL
	}
	fd := f.fd.Fd()
	if typ == p9.WriteLock && !f.write {
		// The Linux client turns flock(LOCK_EX) on a file opened for
		// reading into a write lock, which fcntl takes only on a
		// descriptor open for writing: take it on one kept with this
		// fid, but only where the guest may write the file, and on the
		// very inode it opened (never the name, which may lead elsewhere
		// by now). Where it may not, the lock is refused (EROFS), as the
		// open for writing it stands for would be.
		if f.lockFD == nil {
			if err := f.g.check("lock", f.guest(), "rw"); err != nil {
				return p9.LockStatusError, err
			}
			if f.linked {
				if err := f.g.checkLinksFD("lock", f.rel(), int(f.fd.Fd()), "rw"); err != nil {
					return p9.LockStatusError, err
				}
			}
			lfd, err := reopen(int(f.fd.Fd()), unix.O_RDWR|unix.O_NONBLOCK)
			if err != nil {
				return p9.LockStatusError, nil
			}
			f.lockFD = os.NewFile(uintptr(lfd), f.rel())
		}
		fd = f.lockFD.Fd()
	} else if f.lockFD != nil && typ == p9.Unlock {
		unix.FcntlFlock(f.lockFD.Fd(), unix.F_OFD_SETLK, &lk)
	}
	err := unix.FcntlFlock(fd, unix.F_OFD_SETLK, &lk)
	switch err {
	case nil:
		return p9.LockStatusOK, nil
	case unix.EAGAIN, unix.EACCES:
		return p9.LockStatusBlocked, nil
	}
	return p9.LockStatusError, nil
}

// Create implements p9.File: a new regular file, owned by the host user,
// without set-user-ID or set-group-ID bits. Without O_EXCL an existing
// regular file is opened instead, as open(2) would; an existing FIFO,
// socket or device is refused and never opened (see openNode), so a
// create can never block the gateway on a FIFO the host has.
func (f *file) Create(name string, flags p9.OpenFlags, perm p9.FileMode, _ p9.UID, _ p9.GID) (p9.File, p9.QID, uint32, error) {
	if err := checkName(name); err != nil {
		return nil, p9.QID{}, 0, err
	}
	c := f.child(name)
	if err := f.g.checkNewFor("create", c.guest(), c); err != nil {
		return nil, p9.QID{}, 0, err
	}
	mode := uint32(perm) & 0o777
	acc := int(flags.Mode()) | int(uint32(flags)&(unix.O_TRUNC|unix.O_APPEND))
	excl := uint32(flags)&unix.O_EXCL != 0
	for try := 0; ; try++ {
		if !excl {
			// An existing file is opened (and maybe truncated) by the
			// create: decide its other names first.
			fd, st, err := f.g.openNode(c.rel(), acc, func(st *unix.Stat_t) error {
				if st.Mode&unix.S_IFMT == unix.S_IFDIR {
					return linux.EISDIR
				}
				return f.g.checkLinks("create", c.rel(), st, "rw")
			})
			switch err {
			case nil:
				if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, acc&unix.O_APPEND); err != nil {
					unix.Close(fd)
					return nil, p9.QID{}, 0, err
				}
				return f.created(c, fd, &st, flags)
			case errSymlink:
				return nil, p9.QID{}, 0, linux.EEXIST
			case errNotFile:
				return nil, p9.QID{}, 0, f.g.refuse("create", c.guest(), "exists and is not a regular file (a FIFO, socket or device is never opened on the host)", linux.EPERM)
			case linux.ENOENT, unix.ENOENT:
			default:
				return nil, p9.QID{}, 0, err
			}
		}
		fd, err := f.g.openat(c.rel(), acc|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, mode)
		if err == unix.EEXIST && !excl && try < 3 {
			continue // made by someone else since the look: open it
		}
		if err != nil {
			return nil, p9.QID{}, 0, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, p9.QID{}, 0, err
		}
		if mode&f.g.umask != 0 && st.Mode&0o7777 == mode&^f.g.umask {
			// The host's umask took bits the guest (which applied its
			// own) asked for.
			unix.Fchmod(fd, mode)
		}
		if err := f.g.giveAway(fd, &st); err != nil {
			unix.Close(fd)
			return nil, p9.QID{}, 0, err
		}
		return f.created(c, fd, &st, flags)
	}
}

// created completes Create with open descriptor fd of c.
func (f *file) created(c *file, fd int, st *unix.Stat_t, flags p9.OpenFlags) (p9.File, p9.QID, uint32, error) {
	c.fd = os.NewFile(uintptr(fd), c.rel())
	c.write = flags.Mode() != p9.ReadOnly
	c.linked = st.Nlink > 1
	return c, qid(st), 0, nil
}

// Mkdir implements p9.File.
func (f *file) Mkdir(name string, perm p9.FileMode, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := checkName(name); err != nil {
		return p9.QID{}, err
	}
	c := f.child(name)
	if err := f.g.checkNew("mkdir", c.guest()); err != nil {
		return p9.QID{}, err
	}
	dfd, err := f.g.dirFD(f.rel())
	if err != nil {
		return p9.QID{}, err
	}
	defer unix.Close(dfd)
	mode := uint32(perm) & 0o1777
	if err := unix.Mkdirat(dfd, name, mode); err != nil {
		return p9.QID{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return p9.QID{}, err
	}
	if st.Mode&0o1777 != mode || f.g.chown {
		cfd, err := f.g.openat(c.rel(), unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY, 0)
		if err != nil {
			return p9.QID{}, err
		}
		defer unix.Close(cfd)
		if st.Mode&0o1777 != mode {
			unix.Chmod("/proc/self/fd/"+strconv.Itoa(cfd), mode)
		}
		if err := f.g.giveAway(cfd, &st); err != nil {
			return p9.QID{}, err
		}
	}
	return qid(&st), nil
}

// Symlink implements p9.File. The link's target must not name a denied
// path, and must obey the rule of checkTarget: on the host, where users and
// tools follow links, it must never lead outside the mount, wherever the
// link is later moved.
func (f *file) Symlink(target, name string, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := checkName(name); err != nil {
		return p9.QID{}, err
	}
	c := f.child(name)
	p := c.guest()
	if err := f.g.checkNew("symlink", p); err != nil {
		return p9.QID{}, err
	}
	f.g.nsMu.Lock()
	defer f.g.nsMu.Unlock()
	if _, reason, errno := f.g.checkTarget(f.rel(), target); reason != "" {
		if errno == linux.EINVAL {
			return p9.QID{}, errno
		}
		return p9.QID{}, f.g.refuse("symlink", p, reason, errno)
	}
	dfd, err := f.g.dirFD(f.rel())
	if err != nil {
		return p9.QID{}, err
	}
	defer unix.Close(dfd)
	if err := unix.Symlinkat(target, dfd, name); err != nil {
		return p9.QID{}, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return p9.QID{}, err
	}
	if f.g.chown {
		lfd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return p9.QID{}, err
		}
		defer unix.Close(lfd)
		if err := f.g.giveAway(lfd, &st); err != nil {
			return p9.QID{}, err
		}
	}
	return qid(&st), nil
}

// Link implements p9.File. The target must be writable where it is (else
// a link would make a read-only or denied file writable elsewhere) and may
// not be a directory; a symlink must obey checkTarget's rule at its new
// place.
func (f *file) Link(target p9.File, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	t, ok := target.(*file)
	if !ok || t.g != f.g || t.parent == nil {
		return linux.EXDEV
	}
	c := f.child(name)
	if err := f.g.checkNew("link", c.guest()); err != nil {
		return err
	}
	if refused, _ := f.g.decide("link", t.guest(), "rw"); refused {
		return linux.EACCES
	}
	f.g.nsMu.Lock()
	defer f.g.nsMu.Unlock()
	sfd, err := f.g.dirFD(t.parent.rel())
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, t.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		// A hard link of a symlink is the same link at a new place.
		if reason, errno := f.g.symlinkFits(sfd, t.name, f.rel(), name); reason != "" {
			return f.g.refuse("link", c.guest(), reason, errno)
		}
	}
	dfd, err := f.g.dirFD(f.rel())
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return unix.Linkat(sfd, t.name, dfd, name, 0)
}

// Mknod implements p9.File: device nodes, FIFOs and sockets are never
// created on the host.
func (f *file) Mknod(name string, mode p9.FileMode, _, _ uint32, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := checkName(name); err != nil {
		return p9.QID{}, err
	}
	return p9.QID{}, f.g.refuse("mknod", f.child(name).guest(), "device nodes, FIFOs and sockets are not created on the host", linux.EPERM)
}

// Rename implements p9.File (never called on a server).
func (f *file) Rename(p9.File, string) error { return linux.ENOSYS }

// RenameAt implements p9.File. The source must be writable (moving a file
// away changes where it was) and the target creatable. A directory moves
// only if every path inside it is writable both where it is and where it
// would land; otherwise the answer is EXDEV, on which mv, npm and friends
// copy file by file, each copy decided on its own.
func (f *file) RenameAt(oldName string, newDir p9.File, newName string) error {
	nd, ok := newDir.(*file)
	if !ok || nd.g != f.g {
		return linux.EXDEV
	}
	if err := checkName(oldName); err != nil {
		return err
	}
	if err := checkName(newName); err != nil {
		return err
	}
	src, dst := f.child(oldName), nd.child(newName)
	what := "rename " + src.guest() + " to " + dst.guest() // one question for both names
	if err := f.g.checkWhat("rename", src.guest(), "rw", what, nil); err != nil {
		return err
	}
	if err := f.g.checkNewWhat("rename", dst.guest(), what, nil); err != nil {
		return err
	}
	f.g.nsMu.Lock()
	defer f.g.nsMu.Unlock()
	sfd, err := f.g.dirFD(f.rel())
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, oldName, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		if reason, errno := f.g.symlinkFits(sfd, oldName, nd.rel(), newName); reason != "" {
			return f.g.refuse("rename", src.guest(), reason, errno)
		}
	case unix.S_IFDIR:
		if reason := f.g.movable(src.rel(), src.guest(), dst.guest(), dst.rel()); reason != "" {
			return f.g.refuse("rename", src.guest(), reason+"; answered EXDEV so the guest copies file by file", linux.EXDEV)
		}
	}
	dfd, err := f.g.dirFD(nd.rel())
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Renameat(sfd, oldName, dfd, newName); err != nil {
		return hostErr(err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		f.g.forgetDirs()
	}
	return nil
}

// movableLimit bounds the walk of a directory about to be renamed.
const movableLimit = 10000

// movable walks directory rel (guest path from; relative path toRel and
// guest path to where it would land) and reports why it may not move, or
// "". Entries of unknown type (a file system that does not fill d_type)
// are stated.
func (g *Gateway) movable(rel, from, to, toRel string) string {
	n := 0
	prof := g.cfg.Profile()
	var walk func(rel, from, to, toRel string) string
	walk = func(rel, from, to, toRel string) string {
		fd, err := g.openat(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
		if err != nil {
			return "cannot read " + from
		}
		names, err := g.readDir(fd)
		if err != nil {
			unix.Close(fd)
			return "cannot read " + from
		}
		var dirs []string
		for _, e := range names {
			if e.name == "." || e.name == ".." {
				continue
			}
			if n++; n > movableLimit {
				unix.Close(fd)
				return "directory holds more than " + strconv.Itoa(movableLimit) + " entries"
			}
			fp, tp := from+"/"+e.name, to+"/"+e.name
			if !g.decision(prof, fp, "rw").Allow {
				unix.Close(fd)
				return fp + " is not writable"
			}
			if !g.decision(prof, tp, "rw").Allow {
				unix.Close(fd)
				return tp + " would not be writable"
			}
			typ := e.typ
			if typ == unix.DT_UNKNOWN {
				var st unix.Stat_t
				if err := unix.Fstatat(fd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
					unix.Close(fd)
					return "cannot stat " + fp
				}
				switch st.Mode & unix.S_IFMT {
				case unix.S_IFDIR:
					typ = unix.DT_DIR
				case unix.S_IFLNK:
					typ = unix.DT_LNK
				}
			}
			switch typ {
			case unix.DT_DIR:
				dirs = append(dirs, e.name)
			case unix.DT_LNK:
				if reason, _ := g.symlinkFits(fd, e.name, toRel, e.name); reason != "" {
					unix.Close(fd)
					return reason
				}
			}
		}
		unix.Close(fd)
		for _, d := range dirs {
			if r := walk(rel+"/"+d, from+"/"+d, to+"/"+d, toRel+"/"+d); r != "" {
				return r
			}
		}
		return ""
	}
	return walk(rel, from, to, toRel)
}

// Renamed implements p9.File.
func (f *file) Renamed(newDir p9.File, newName string) {
	if nd, ok := newDir.(*file); ok {
		f.parent = nd
	}
	f.name = newName
}

// UnlinkAt implements p9.File.
func (f *file) UnlinkAt(name string, flags uint32) error {
	if err := checkName(name); err != nil {
		return err
	}
	c := f.child(name)
	if err := f.g.check("unlink", c.guest(), "rw"); err != nil {
		return err
	}
	dfd, err := f.g.dirFD(f.rel())
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	err = unix.Unlinkat(dfd, name, int(flags&unix.AT_REMOVEDIR))
	if err == nil && flags&unix.AT_REMOVEDIR != 0 {
		f.g.forgetDirs()
	}
	if err == unix.ENOTEMPTY || err == unix.EEXIST {
		// The guest removed everything it sees (rm -r): what is left is
		// hidden from it. ENOTEMPTY is the truth; the log says why.
		f.g.explainNotEmpty(c.rel(), c.guest())
	}
	return hostErr(err)
}

// hostErr keeps a host errno exact on the wire: p9's server maps errors
// through os.ErrExist and os.ErrPermission first, which turns ENOTEMPTY
// into EEXIST ("File exists" for an rm -r) and EPERM into EACCES.
func hostErr(err error) error {
	if e, ok := err.(unix.Errno); ok {
		return linux.Errno(e)
	}
	return err
}

// explainNotEmpty logs why directory rel, which the guest failed to
// remove, is not empty for it: the entries the profile hides stay.
func (g *Gateway) explainNotEmpty(rel, p string) {
	fd, err := g.openat(rel, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	names, err := g.readDir(fd)
	unix.Close(fd)
	if err != nil {
		return
	}
	prof := g.cfg.Profile()
	var hidden []string
	var rule string
	n := 0
	for _, e := range names {
		if e.name == "." || e.name == ".." {
			continue
		}
		n++
		d := g.decision(prof, p+"/"+e.name, "ro")
		if d.Allow {
			return // something the guest sees is still there: an ordinary ENOTEMPTY
		}
		if rule == "" {
			rule = d.Rule
		}
		if len(hidden) < 3 {
			hidden = append(hidden, strconv.Quote(e.name))
		}
	}
	if len(hidden) == 0 {
		return
	}
	more := ""
	if n > len(hidden) {
		more = fmt.Sprintf(" and %d more", n-len(hidden))
	}
	g.limit.refuse("rmdir", p, rule, "directory not empty: it holds "+strings.Join(hidden, ", ")+more+", hidden from the guest by the profile, which stay on the host")
}

// Readdir implements p9.File. Denied entries are left out. The listing is
// read when the guest starts at offset 0; later offsets page through it.
func (f *file) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	if f.fd == nil {
		return nil, linux.EBADF
	}
	p := f.guest()
	if err := f.g.check("readdir", p, "ro"); err != nil {
		return nil, err
	}
	if offset == 0 || f.dirents == nil {
		if _, err := f.fd.Seek(0, 0); err != nil {
			return nil, err
		}
		names, err := f.g.readDir(int(f.fd.Fd()))
		if err != nil {
			return nil, err
		}
		ents := make([]p9.Dirent, 0, len(names))
		for _, e := range names {
			if e.name != "." && e.name != ".." && !f.g.visible(p+"/"+e.name) {
				continue
			}
			t := p9.TypeRegular
			switch e.typ {
			case unix.DT_DIR:
				t = p9.TypeDir
			case unix.DT_LNK:
				t = p9.TypeSymlink
			}
			// The Linux client hands the entry's type to readdir as the
			// d_type (DT_*), as QEMU sends it; the QID carries the 9P type.
			ents = append(ents, p9.Dirent{QID: p9.QID{Type: t, Path: e.ino}, Type: p9.QIDType(e.typ), Name: e.name, Offset: uint64(len(ents) + 1)})
		}
		f.dirents = ents
	}
	if offset >= uint64(len(f.dirents)) {
		return nil, nil
	}
	// Each entry takes at least 24 bytes on the wire; the server trims to
	// count.
	end := min(uint64(len(f.dirents)), offset+uint64(count/24)+1)
	return f.dirents[offset:end], nil
}

type dirent struct {
	name string
	ino  uint64
	typ  uint8
}

// readDir is readNames, with every type unknown when noDType is set.
func (g *Gateway) readDir(fd int) ([]dirent, error) {
	ents, err := readNames(fd)
	if g.noDType {
		for i := range ents {
			ents[i].typ = unix.DT_UNKNOWN
		}
	}
	return ents, err
}

// readNames reads a directory's entries with getdents64, keeping inode
// and type, which spare a stat per entry.
func readNames(fd int) ([]dirent, error) {
	var out []dirent
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		for b := buf[:n]; len(b) >= 19; {
			ino := binary.NativeEndian.Uint64(b[0:])
			reclen := int(binary.NativeEndian.Uint16(b[16:]))
			if reclen < 19 || reclen > len(b) {
				break
			}
			typ := b[18]
			name := b[19:reclen]
			if i := indexNUL(name); i >= 0 {
				name = name[:i]
			}
			out = append(out, dirent{name: string(name), ino: ino, typ: typ})
			b = b[reclen:]
		}
	}
}

func indexNUL(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

// Readlink implements p9.File.
func (f *file) Readlink() (string, error) {
	if err := f.g.check("readlink", f.guest(), "ro"); err != nil {
		return "", err
	}
	if f.parent == nil {
		return "", linux.EINVAL
	}
	dfd, err := f.g.dirFD(f.parent.rel())
	if err != nil {
		return "", err
	}
	defer unix.Close(dfd)
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dfd, f.name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// Extended attributes: only the user namespace. security.* (file
// capabilities, SELinux labels) and trusted.* on host files would reach
// beyond the folder's contents.
func xattrAllowed(name string) bool { return strings.HasPrefix(name, "user.") }

// xattrFD opens a regular file or directory for its attributes (f's own
// descriptor when open). Symlinks have none here.
func (f *file) xattrFD() (int, func(), error) {
	if f.fd != nil {
		return int(f.fd.Fd()), func() {}, nil
	}
	fd, _, err := f.g.openNode(f.rel(), unix.O_RDONLY, nil)
	if err == errNotFile || err == errSymlink {
		return -1, nil, linux.EOPNOTSUPP
	}
	if err != nil {
		return -1, nil, err
	}
	return fd, func() { unix.Close(fd) }, nil
}

// SetXattr implements p9.File.
func (f *file) SetXattr(name string, data []byte, flags p9.XattrFlags) error {
	p := f.guest()
	if !xattrAllowed(name) {
		return f.g.refuse("setxattr", p, "attribute "+strconv.Quote(name)+" is outside the user namespace", linux.EPERM)
	}
	if err := f.g.check("setxattr", p, "rw"); err != nil {
		return err
	}
	fd, done, err := f.xattrFD()
	if err != nil {
		return err
	}
	defer done()
	if err := f.g.checkLinksFD("setxattr", f.rel(), fd, "rw"); err != nil {
		return err
	}
	return unix.Fsetxattr(fd, name, data, int(flags))
}

// GetXattr implements p9.File. An attribute that is not there reads as
// empty: p9's server turns every getxattr error into EINVAL, which tools
// such as ls (probing ACLs and SELinux labels) report as a failure, while
// an empty value means "none" to them.
func (f *file) GetXattr(name string) ([]byte, error) {
	if err := f.g.check("getxattr", f.guest(), "ro"); err != nil {
		return nil, err
	}
	if !xattrAllowed(name) {
		return nil, nil
	}
	fd, done, err := f.xattrFD()
	if err != nil {
		return nil, nil
	}
	defer done()
	buf := make([]byte, 64<<10)
	n, err := unix.Fgetxattr(fd, name, buf)
	if err != nil {
		return nil, nil
	}
	return buf[:n], nil
}

// ListXattrs implements p9.File.
func (f *file) ListXattrs() ([]string, error) {
	if err := f.g.check("listxattr", f.guest(), "ro"); err != nil {
		return nil, err
	}
	fd, done, err := f.xattrFD()
	if err != nil {
		if err == linux.EOPNOTSUPP {
			return nil, nil
		}
		return nil, err
	}
	defer done()
	buf := make([]byte, 64<<10)
	n, err := unix.Flistxattr(fd, buf)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range strings.Split(string(buf[:n]), "\x00") {
		if s != "" && xattrAllowed(s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// RemoveXattr implements p9.File.
func (f *file) RemoveXattr(name string) error {
	p := f.guest()
	if !xattrAllowed(name) {
		return f.g.refuse("removexattr", p, "attribute "+strconv.Quote(name)+" is outside the user namespace", linux.EPERM)
	}
	if err := f.g.check("removexattr", p, "rw"); err != nil {
		return err
	}
	fd, done, err := f.xattrFD()
	if err != nil {
		return err
	}
	defer done()
	if err := f.g.checkLinksFD("removexattr", f.rel(), fd, "rw"); err != nil {
		return err
	}
	return unix.Fremovexattr(fd, name)
}
