// Package tarfs packs host files into tar streams and extracts tar streams
// into a directory. It is the one place that turns a tar stream from a
// guest into host files, and it treats every such stream as hostile: the
// host, not the stream, names what is written (see Extract and Receive).
//
// Pack reads a tree that a guest may be changing at the same time (a
// folder it shares): it walks by descriptors, opens nothing through a
// symlink, and checks that each file it opens is the inode it listed.
package tarfs

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// testHookOpen, when set, runs between a walk's lstat of a host path and
// its open: tests swap the file there.
var testHookOpen func(path string)

// Pack writes a tar stream of src (file, directory or symlink) to w. The
// top entry is named name; directory contents follow recursively, each
// directory before its entries. Owners are numeric (names mean nothing on
// the other side of a VM boundary) and hard links within the tree stay
// links. The path up to src is resolved as given; below it no symlink is
// followed, and a file swapped while it is being archived fails the pack.
func Pack(w io.Writer, src, name string) error {
	src = filepath.Clean(src)
	parent, err := os.Open(filepath.Dir(src))
	if err != nil {
		return fmt.Errorf("tarfs: pack %s: %w", src, err)
	}
	defer parent.Close()
	p := &packer{tw: tar.NewWriter(w), links: map[inode]string{}}
	if err := p.add(int(parent.Fd()), filepath.Base(src), src, name); err != nil {
		return fmt.Errorf("tarfs: pack %s: %w", src, err)
	}
	return p.tw.Close()
}

type inode struct{ dev, ino uint64 }

type packer struct {
	tw    *tar.Writer
	links map[inode]string
}

// add archives base, an entry of directory dirfd, as entry; host is its
// path for messages and the test hook.
func (p *packer) add(dirfd int, base, host, entry string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "lstat", Path: host, Err: err}
	}
	hdr := &tar.Header{
		Name:    entry,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Unix()),
	}
	seen := inode{uint64(st.Dev), st.Ino}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if st.Nlink > 1 {
			if first, ok := p.links[seen]; ok {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				return p.tw.WriteHeader(hdr)
			}
			p.links[seen] = entry
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size
		f, err := openSame(dirfd, base, host, seen, unix.O_RDONLY|unix.O_NONBLOCK)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := p.tw.WriteHeader(hdr); err != nil {
			return err
		}
		// Exactly Size bytes: a file that grows while archived must not
		// corrupt the stream.
		_, err = io.Copy(p.tw, io.LimitReader(f, hdr.Size))
		return err
	case unix.S_IFDIR:
		f, err := openSame(dirfd, base, host, seen, unix.O_RDONLY|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		defer f.Close()
		hdr.Typeflag, hdr.Name = tar.TypeDir, entry+"/"
		if err := p.tw.WriteHeader(hdr); err != nil {
			return err
		}
		names, err := f.Readdirnames(-1)
		if err != nil {
			return err
		}
		slices.Sort(names)
		for _, n := range names {
			if err := p.add(int(f.Fd()), n, filepath.Join(host, n), path.Join(entry, n)); err != nil {
				return err
			}
		}
		return nil
	case unix.S_IFLNK:
		buf := make([]byte, 256)
		for {
			n, err := unix.Readlinkat(dirfd, base, buf)
			if err != nil {
				return &os.PathError{Op: "readlink", Path: host, Err: err}
			}
			if n < len(buf) {
				hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(buf[:n])
				break
			}
			buf = make([]byte, 2*len(buf))
		}
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if st.Mode&unix.S_IFMT == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	default:
		return fmt.Errorf("%s: sockets cannot be copied", host)
	}
	return p.tw.WriteHeader(hdr)
}

// openSame opens base in dirfd without following a symlink and checks it
// is the inode the walk listed: whoever swaps the name in between (a guest
// writing the same shared folder) gets an error, not a read of the new
// target.
func openSame(dirfd int, base, host string, seen inode, flags int) (*os.File, error) {
	if testHookOpen != nil {
		testHookOpen(host)
	}
	fd, err := unix.Openat(dirfd, base, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ELOOP || (err == unix.ENOTDIR && flags&unix.O_DIRECTORY != 0) {
			return nil, fmt.Errorf("%s changed while it was being copied (now a symlink): copy it again", host)
		}
		return nil, &os.PathError{Op: "open", Path: host, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: host, Err: err}
	}
	if (inode{uint64(st.Dev), st.Ino}) != seen {
		unix.Close(fd)
		return nil, fmt.Errorf("%s changed while it was being copied: copy it again", host)
	}
	if flags&unix.O_NONBLOCK != 0 {
		// Regular files ignore O_NONBLOCK; it only kept a FIFO swapped
		// in from blocking the open, and the inode check refused it.
		unix.SetNonblock(fd, false)
	}
	return os.NewFile(uintptr(fd), host), nil
}
