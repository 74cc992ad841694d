package tarfs

import (
	"archive/tar"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Defaults for Limits.
const (
	DefaultMaxBytes   = 16 << 30 // file content in one copy
	DefaultMaxEntries = 1 << 20  // entries in one copy
	// maxName bounds an entry's name and a symlink's target, as PATH_MAX.
	maxName = 4096
)

// Limits bound what Extract accepts from one stream; a zero field takes
// its default. They keep a hostile stream from filling the host's disk or
// memory: the copy fails, and nothing is left.
type Limits struct {
	Bytes   int64 // total file content (DefaultMaxBytes)
	Entries int   // entries (DefaultMaxEntries)
}

// Options tune Extract.
type Options struct {
	// From is the top name every entry must carry: the base name of the
	// path that was archived, as Pack named it. "." means the stream is a
	// directory's contents ("./" and names below it).
	From string
	// Name is the host's name for the top entry in the target directory;
	// empty means From, which must then be a plain name.
	Name string
	// Chown applies the entries' uid/gid (only meaningful as root).
	Chown bool
	// Limits bound the stream.
	Limits Limits
}

// Extract unpacks r, a stream holding one top entry named opt.From (a
// file, a symlink or a directory with its tree), into dir as opt.Name. The
// host names the result; the stream only names what lies below it. The
// stream is hostile input and is refused, with nothing written outside a
// private directory that is removed again, when any entry:
//   - lies outside From, is not a clean relative name, or repeats a name;
//   - comes before its directory, or lies below a symlink (so nothing is
//     ever written through a link, even one pointing inside the tree);
//   - is a hard link to anything but an earlier entry of the same tree;
//   - is a device, FIFO or any type but file, directory, symlink and
//     hard link;
//   - goes past Limits, or has a name or link target over 4096 bytes.
//
// Set-user-ID, set-group-ID and sticky bits are dropped. Symlink targets
// are written as they are and never followed here; whoever later follows
// one resolves it on the host.
//
// The tree is built in a private directory inside dir and moved into
// place only once the whole stream was accepted: a new name by one
// rename; an existing file or symlink named opt.Name is replaced by the
// rename; an existing directory is merged into (an existing file inside
// it is replaced, as cp does). Nothing outside dir/Name is touched. It
// returns the bytes of file content written.
func Extract(r io.Reader, dir string, opt Options) (int64, error) {
	if opt.Name == "" {
		opt.Name = opt.From
	}
	if !plainName(opt.Name) {
		return 0, fmt.Errorf("tarfs: %q cannot name a copy: name a file or directory: %w", opt.Name, errdefs.ErrInvalid)
	}
	if opt.From != "." && !plainName(opt.From) {
		return 0, fmt.Errorf("tarfs: cannot copy %q by its name: %w", opt.From, errdefs.ErrInvalid)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, fmt.Errorf("tarfs: %w", err)
	}
	defer root.Close()
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := ".smx-cp-" + hex.EncodeToString(rnd[:])
	if err := root.Mkdir(tmp, 0o700); err != nil {
		return 0, fmt.Errorf("tarfs: %w", err)
	}
	defer root.RemoveAll(tmp)
	troot, err := root.OpenRoot(tmp)
	if err != nil {
		return 0, fmt.Errorf("tarfs: %w", err)
	}
	x := &extractor{checker: newChecker(opt, "nothing was written"), root: troot}
	err = x.run(tar.NewReader(r))
	troot.Close()
	if err != nil {
		return 0, err
	}
	if err := place(root, tmp+"/"+opt.Name, opt.Name, x.topDir); err != nil {
		return 0, fmt.Errorf("tarfs: %w", err)
	}
	// Directory modes last (deepest first): a read-only directory must
	// still take its entries.
	for _, d := range slices.Backward(x.dirMeta) {
		if opt.Chown {
			root.Lchown(d.name, d.uid, d.gid)
		}
		if err := root.Chmod(d.name, d.mode); err != nil {
			return x.total, fmt.Errorf("tarfs: %s: %w", d.name, err)
		}
		root.Chtimes(d.name, d.t, d.t)
	}
	return x.total, nil
}

// Receive copies src, a path on the other side of send (a guest), to the
// host path dst, docker cp's way: into dst when dst is a directory (as
// src's base name), else to dst itself, whose directory must exist. send
// writes Pack's stream of src, named by src's base name as the guest's
// archiver names it ("." for "/" and paths ending in "/."); Extract
// checks it. The contents of a directory ("/", "DIR/.") can only be
// copied to a new path: into an existing directory they would be names
// the stream chooses. CLI and MCP copies come here; a stream handed on
// as a stream goes through Forward.
func Receive(dst, src string, opt Options, send func(io.Writer) error) (int64, error) {
	opt.From = GuestName(src)
	dir, name := dst, opt.From
	if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
		if opt.From == "." {
			return 0, fmt.Errorf("copying the contents of %s into the existing directory %s would let the sandbox name the files: give a new path as the destination: %w", src, dst, errdefs.ErrInvalid)
		}
	} else {
		dir, name = filepath.Dir(dst), filepath.Base(dst)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		if err == nil {
			return 0, fmt.Errorf("%s is not a directory: %w", dir, errdefs.ErrInvalid)
		}
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("no such directory %s on the host: create it first: %w", dir, errdefs.ErrNotFound)
		}
		return 0, fmt.Errorf("cp: destination: %w", err)
	}
	opt.Name = name
	return pipe(send, func(r io.Reader) (int64, error) { return Extract(r, dir, opt) })
}

// Forward passes the stream send writes for src (see Receive) to w
// through Check.
func Forward(w io.Writer, src string, opt Options, send func(io.Writer) error) (int64, error) {
	opt.From = GuestName(src)
	return pipe(send, func(r io.Reader) (int64, error) { return Check(w, r, opt) })
}

// pipe runs send into consume. When consume refused the stream, the
// sender only saw that refusal come back through the pipe: the refusal is
// the error. Otherwise the sender's own failure (no such path in the
// guest) comes first.
func pipe(send func(io.Writer) error, consume func(io.Reader) (int64, error)) (int64, error) {
	pr, pw := io.Pipe()
	type res struct {
		n   int64
		err error
	}
	done := make(chan res, 1)
	go func() {
		n, err := consume(pr)
		if err == nil {
			// Padding after the archive's end is read, within reason;
			// a refused stream stops the sender at once.
			io.CopyN(io.Discard, pr, 1<<20)
			pr.CloseWithError(errTrailing)
		} else {
			pr.CloseWithError(err)
		}
		done <- res{n, err}
	}()
	err := send(pw)
	if err != nil {
		pw.CloseWithError(err)
	} else {
		pw.Close()
	}
	x := <-done
	if err != nil && (x.err == nil || !errors.Is(err, x.err)) {
		return 0, err
	}
	if x.err != nil {
		return 0, x.err
	}
	return x.n, nil
}

// GuestName is the top name Pack gives the stream of guest path p, as
// the guest agent calls it: p's base name, or "." for "/".
func GuestName(p string) string {
	if b := path.Base(p); b != "/" {
		return b
	}
	return "."
}

var errTrailing = errors.New("tarfs: data after the end of the archive")

// plainName reports whether n names one entry of a directory.
func plainName(n string) bool {
	return n != "" && n != "." && n != ".." && !strings.ContainsAny(n, "/\x00")
}

type dirMeta struct {
	name     string
	t        time.Time
	mode     fs.FileMode
	uid, gid int
}

type extractor struct {
	checker
	root    *os.Root
	dirMeta []dirMeta
}

func (x *extractor) run(tr *tar.Reader) error {
	for {
		hdr, err := x.next(tr)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := x.entry(hdr, tr); err != nil {
			return err
		}
	}
}

// entry writes one checked entry; hdr.Name is already its local name.
func (x *extractor) entry(hdr *tar.Header, tr io.Reader) error {
	name, mode := hdr.Name, fs.FileMode(hdr.Mode)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := x.root.Mkdir(name, 0o700); err != nil {
			return x.failed(name, err)
		}
		x.dirMeta = append(x.dirMeta, dirMeta{name, hdr.ModTime, mode, hdr.Uid, hdr.Gid})
		return nil
	case tar.TypeReg:
		f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return x.failed(name, err)
		}
		_, err = io.Copy(f, tr)
		if err == nil {
			err = f.Chmod(mode)
		}
		if err == nil && x.opt.Chown {
			if cerr := f.Chown(hdr.Uid, hdr.Gid); cerr != nil && !errors.Is(cerr, fs.ErrPermission) {
				err = cerr
			}
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return x.failed(name, err)
		}
		x.root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		return nil
	case tar.TypeSymlink:
		if err := x.root.Symlink(hdr.Linkname, name); err != nil {
			return x.failed(name, err)
		}
		if x.opt.Chown {
			if err := x.root.Lchown(name, hdr.Uid, hdr.Gid); err != nil && !errors.Is(err, fs.ErrPermission) {
				return x.failed(name, err)
			}
		}
		return nil
	case tar.TypeLink:
		if err := x.root.Link(hdr.Linkname, name); err != nil {
			return x.failed(name, err)
		}
		return nil
	}
	return fmt.Errorf("tarfs: %s: unchecked entry type %q", name, hdr.Typeflag)
}

// failed is the error for an entry the file system would not take; in a
// fresh private directory, "exists" means the stream repeated a name.
func (x *extractor) failed(entry string, err error) error {
	if errors.Is(err, fs.ErrExist) {
		return x.refuse("entry %q appears twice", entry)
	}
	return fmt.Errorf("tarfs: %s: %w", entry, err)
}

// place moves the extracted tree from into to (both in root). A directory
// merges into an existing directory; anything else replaces an existing
// file or symlink by one rename, and never a directory.
func place(root *os.Root, from, to string, isDir bool) error {
	fi, err := root.Lstat(to)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return root.Rename(from, to)
	case err != nil:
		return err
	case isDir && fi.IsDir():
	case isDir:
		return fmt.Errorf("cannot replace %s, which is not a directory, with a directory: %w", to, errdefs.ErrExists)
	case fi.IsDir():
		return fmt.Errorf("cannot replace the directory %s with a file: %w", to, errdefs.ErrExists)
	default:
		return root.Rename(from, to)
	}
	f, err := root.Open(from)
	if err != nil {
		return err
	}
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := place(root, from+"/"+e.Name(), to+"/"+e.Name(), e.IsDir()); err != nil {
			return err
		}
	}
	return nil
}
