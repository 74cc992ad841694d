// Package tarfs packs host files into tar streams and extracts tar streams
// into a directory without letting any entry escape it. The streams that
// come back from a guest are untrusted: extraction goes through os.Root, so
// "..", absolute names and symlinks planted by the guest cannot reach
// outside the target directory.
package tarfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Pack writes a tar stream of src (file, directory or symlink) to w. The
// top entry is named name; directory contents follow recursively. Owners
// are numeric (names mean nothing on the other side of a VM boundary) and
// hard links within the tree stay links.
func Pack(w io.Writer, src, name string) error {
	tw := tar.NewWriter(w)
	src = filepath.Clean(src)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	err := filepath.WalkDir(src, func(cur string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, cur)
		if err != nil {
			return err
		}
		entry := path.Join(name, filepath.ToSlash(rel))
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(cur); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = entry
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && fi.Mode().IsRegular() && st.Nlink > 1 {
			key := inode{uint64(st.Dev), st.Ino}
			if first, ok := links[key]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				links[key] = entry
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(cur)
		if err != nil {
			return err
		}
		defer f.Close()
		// Exactly Size bytes: a file that grows while archived must not
		// corrupt the stream.
		_, err = io.Copy(tw, io.LimitReader(f, hdr.Size))
		return err
	})
	if err != nil {
		return fmt.Errorf("tarfs: pack %s: %w", src, err)
	}
	return tw.Close()
}

// Options tune Extract.
type Options struct {
	// Rename replaces the first path element of every entry, so that a
	// stream whose top entry is "a" lands as "b".
	Rename string
	// Chown applies the entries' uid/gid (only meaningful as root).
	Chown bool
}

// Extract unpacks r into dir, which must exist. It returns the bytes of
// file content written.
func Extract(r io.Reader, dir string, opt Options) (int64, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, fmt.Errorf("tarfs: %w", err)
	}
	defer root.Close()
	tr := tar.NewReader(r)
	var total int64
	type dirTime struct {
		name string
		t    time.Time
		mode fs.FileMode
		uid  int
		gid  int
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return total, fmt.Errorf("tarfs: read: %w", err)
		}
		name, err := cleanName(hdr.Name, opt.Rename)
		if err != nil {
			return total, err
		}
		if name == "" {
			continue
		}
		mode := fs.FileMode(hdr.Mode) & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
		if p := path.Dir(name); p != "." {
			if err := root.MkdirAll(p, 0o755); err != nil {
				return total, fmt.Errorf("tarfs: %s: %w", name, err)
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return total, fmt.Errorf("tarfs: %s: %w", name, err)
			}
			// Modes last: a read-only directory must still take its entries.
			dirs = append(dirs, dirTime{name, hdr.ModTime, mode, hdr.Uid, hdr.Gid})
			continue
		case tar.TypeReg:
			root.Remove(name) // replace, never write through an existing symlink
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
			if err != nil {
				return total, fmt.Errorf("tarfs: %s: %w", name, err)
			}
			n, err := io.Copy(f, tr)
			total += n
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return total, fmt.Errorf("tarfs: %s: %w", name, err)
			}
		case tar.TypeSymlink:
			root.Remove(name)
			// The target is stored as is: it is resolved later, and any
			// later extraction through it stays inside root.
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return total, fmt.Errorf("tarfs: %s: %w", name, err)
			}
			continue
		case tar.TypeLink:
			target, err := cleanName(hdr.Linkname, opt.Rename)
			if err != nil || target == "" {
				return total, fmt.Errorf("tarfs: %s: bad hard link target %q", name, hdr.Linkname)
			}
			root.Remove(name)
			if err := root.Link(target, name); err != nil {
				return total, fmt.Errorf("tarfs: %s: %w", name, err)
			}
			continue
		default:
			continue // devices, fifos: not carried across
		}
		if err := root.Chmod(name, mode); err != nil {
			return total, fmt.Errorf("tarfs: %s: %w", name, err)
		}
		if opt.Chown {
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil && !errors.Is(err, syscall.EPERM) {
				return total, fmt.Errorf("tarfs: %s: %w", name, err)
			}
		}
		if hdr.Typeflag == tar.TypeReg {
			root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if opt.Chown {
			root.Lchown(d.name, d.uid, d.gid)
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return total, fmt.Errorf("tarfs: %s: %w", d.name, err)
		}
		root.Chtimes(d.name, d.t, d.t)
	}
	return total, nil
}

// cleanName turns an entry name into a relative slash path inside the
// target, or refuses it.
func cleanName(name, rename string) (string, error) {
	n := path.Clean(strings.TrimPrefix(name, "./"))
	if n == "." {
		return "", nil
	}
	if path.IsAbs(n) || n == ".." || strings.HasPrefix(n, "../") {
		return "", fmt.Errorf("tarfs: entry %q escapes the target directory", name)
	}
	if rename != "" {
		_, rest, _ := strings.Cut(n, "/")
		n = rename
		if rest != "" {
			n = rename + "/" + rest
		}
	}
	return n, nil
}
