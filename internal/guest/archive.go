package guest

import (
	"archive/tar"
	"bufio"
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

	"github.com/smx-dev/smx/internal/agentproto"
)

// frameReader turns FrameData frames into a byte stream that ends at
// FrameEOF. A FrameError from the host (it gave up) is returned as an error.
type frameReader struct {
	r    io.Reader
	buf  []byte
	rest []byte
	eof  bool
}

func (f *frameReader) Read(p []byte) (int, error) {
	for len(f.rest) == 0 {
		if f.eof {
			return 0, io.EOF
		}
		t, payload, err := agentproto.ReadFrame(f.r, f.buf)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		if cap(payload) > cap(f.buf) {
			f.buf = payload[:0]
		}
		switch t {
		case agentproto.FrameData:
			f.rest = payload
		case agentproto.FrameEOF:
			f.eof = true
		case agentproto.FrameError:
			return 0, agentproto.DecodeError(payload)
		default:
			return 0, fmt.Errorf("unexpected %s frame in data stream", t)
		}
	}
	n := copy(p, f.rest)
	f.rest = f.rest[n:]
	return n, nil
}

func (s *Server) copyIn(w io.Writer, stream io.Reader, dir string) error {
	fr := &frameReader{r: stream}
	n, err := extractTar(fr, dir)
	if err != nil {
		writeError(w, err)
		// Keep reading so a host that is still sending can finish and see
		// the error, instead of stalling on a full window.
		_, _ = io.Copy(io.Discard, fr)
		return nil
	}
	// tar stops at its end-of-archive marker; the host may still send
	// padding before FrameEOF.
	if _, err := io.Copy(io.Discard, fr); err != nil {
		return fmt.Errorf("guest: copy-in: %w", err)
	}
	return agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true, Bytes: n})
}

// extractTar unpacks a tar stream under dir, which must exist (docker cp's
// rule, the same for copy-out on the host: a typo in the destination is an
// error, not a new directory tree), and
// returns the number of file bytes written. Every file operation goes
// through an os.Root, so no entry name, hard link or symlink in the
// archive can reach outside dir. Owners are the archive's numeric ids
// (applied only when running as root); names are ignored.
func extractTar(r io.Reader, dir string) (int64, error) {
	if !filepath.IsAbs(dir) {
		return 0, fmt.Errorf("guest: copy-in: path %q is not absolute", dir)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		switch {
		case err == nil:
			err = fmt.Errorf("%s is not a directory in the sandbox", filepath.Clean(dir))
		case errors.Is(err, fs.ErrNotExist):
			err = fmt.Errorf("no such directory %s in the sandbox: create it first", filepath.Clean(dir))
		}
		return 0, fmt.Errorf("guest: copy-in: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, fmt.Errorf("guest: copy-in: %w", err)
	}
	defer root.Close()

	asRoot := os.Geteuid() == 0
	type dirMeta struct {
		name  string
		mode  fs.FileMode
		mtime time.Time
	}
	// Directory modes and times are set last: creating entries inside a
	// directory changes its mtime, and a read-only directory mode would stop
	// an unprivileged extraction from filling it.
	var dirs []dirMeta
	var total int64
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return total, fmt.Errorf("guest: copy-in: read archive: %w", err)
		}
		name, err := entryName(hdr.Name)
		if err != nil {
			return total, err
		}
		mode := fs.FileMode(hdr.Mode) & fs.ModePerm
		fail := func(err error) (int64, error) {
			return total, fmt.Errorf("guest: copy-in: %s: %w", hdr.Name, err)
		}

		if hdr.Typeflag != tar.TypeDir && name != "." {
			// Archives may omit parent directory entries.
			if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
				return fail(err)
			}
			if err := removeExisting(root, name); err != nil {
				return fail(err)
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "." {
				if err := root.MkdirAll(name, 0o700); err != nil {
					return fail(err)
				}
			}
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return fail(err)
			}
			n, err := io.Copy(f, tr)
			total += n
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fail(err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return fail(err)
			}
		case tar.TypeLink:
			target, err := entryName(hdr.Linkname)
			if err != nil {
				return total, err
			}
			if err := root.Link(target, name); err != nil {
				return fail(err)
			}
			continue // a hard link shares its target's metadata
		case tar.TypeXGlobalHeader:
			continue
		default:
			// Devices and FIFOs would need mknod, which os.Root cannot do
			// safely; a copy of a project tree does not need them.
			continue
		}

		if asRoot {
			if err := root.Lchown(name, hdr.Uid, hdr.Gid); err != nil {
				return fail(err)
			}
		}
		if hdr.Typeflag == tar.TypeSymlink {
			continue // symlink modes are meaningless; times follow the link
		}
		mode |= setIDBits(hdr.Mode)
		if hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, dirMeta{name, mode, hdr.ModTime})
			continue
		}
		// After chown, which clears set-id bits.
		if err := root.Chmod(name, mode); err != nil {
			return fail(err)
		}
		if err := root.Chtimes(name, hdr.ModTime, hdr.ModTime); err != nil {
			return fail(err)
		}
	}
	// Deepest first, so that a parent's mode cannot lock out its children.
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		err := root.Chmod(d.name, d.mode)
		if err == nil {
			err = root.Chtimes(d.name, d.mtime, d.mtime)
		}
		if err != nil {
			return total, fmt.Errorf("guest: copy-in: %s: %w", d.name, err)
		}
	}
	return total, nil
}

func setIDBits(m int64) fs.FileMode {
	var out fs.FileMode
	if m&syscall.S_ISUID != 0 {
		out |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		out |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		out |= fs.ModeSticky
	}
	return out
}

// entryName validates an archive path. os.Root would refuse an escape too,
// but a clear message helps whoever built the archive.
func entryName(name string) (string, error) {
	if name == "" {
		return "", errors.New("guest: copy-in: empty entry name")
	}
	if path.IsAbs(name) || strings.HasPrefix(name, `\`) {
		return "", fmt.Errorf("guest: copy-in: entry %q: absolute path refused", name)
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", fmt.Errorf("guest: copy-in: entry %q: path escapes the target directory", name)
		}
	}
	return path.Clean(name), nil
}

// removeExisting clears the way for a non-directory entry, as tar does: a
// file or symlink in the way is replaced, a non-empty directory is not.
func removeExisting(root *os.Root, name string) error {
	err := root.Remove(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

func (s *Server) copyOut(w io.Writer, p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("guest: copy-out: path %q is not absolute", p)
	}
	if _, err := os.Lstat(p); err != nil {
		return fmt.Errorf("guest: copy-out: %w", err)
	}
	// Buffer so that tar's 512-byte headers do not each become a frame.
	bw := bufio.NewWriterSize(agentproto.FrameWriter{W: w, Type: agentproto.FrameData}, agentproto.DataChunk)
	if err := writeTar(bw, p); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("guest: copy-out: %w", err)
	}
	return agentproto.WriteFrame(w, agentproto.FrameEOF, nil)
}
