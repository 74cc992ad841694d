package tarfs

import (
	"archive/tar"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
)

// checker holds the rules a stream from a guest must keep, for Extract
// (which then writes each entry) and Check (which passes it on).
type checker struct {
	opt     Options
	outcome string          // what a refusal means for the caller's output
	kinds   map[string]byte // local name -> its type flag, for every entry so far
	topDir  bool
	entries int
	total   int64 // file content so far
}

func newChecker(opt Options, outcome string) checker {
	if opt.Name == "" {
		opt.Name = opt.From
	}
	if opt.Limits.Bytes <= 0 {
		opt.Limits.Bytes = DefaultMaxBytes
	}
	if opt.Limits.Entries <= 0 {
		opt.Limits.Entries = DefaultMaxEntries
	}
	return checker{opt: opt, outcome: outcome, kinds: map[string]byte{}}
}

// refuse is the error for a stream that breaks a rule.
func (c *checker) refuse(format string, args ...any) error {
	return fmt.Errorf("tarfs: refused the copy of %s, %s: %s: %w",
		c.opt.From, c.outcome, fmt.Sprintf(format, args...), errdefs.ErrDenied)
}

// next reads the next entry and checks it. The header it returns is
// rewritten for the host: Name and (for a hard link) Linkname are local
// names (opt.Name, or opt.Name/...; a directory without its trailing
// slash), Mode holds only permission bits. It returns io.EOF at the end
// of a stream that had entries.
func (c *checker) next(tr *tar.Reader) (*tar.Header, error) {
	hdr, err := tr.Next()
	if err == io.EOF {
		if c.entries == 0 {
			return nil, c.refuse("it is empty")
		}
		return nil, io.EOF
	}
	if err != nil {
		return nil, fmt.Errorf("tarfs: the archive is broken: %w", err)
	}
	if c.entries++; c.entries > c.opt.Limits.Entries {
		return nil, c.refuse("it has more than %d entries", c.opt.Limits.Entries)
	}
	name, err := c.local(hdr.Name)
	if err != nil {
		return nil, err
	}
	top := name == c.opt.Name
	if top && c.entries > 1 {
		return nil, c.refuse("entry %q repeats the top entry", hdr.Name)
	}
	if !top && c.kinds[path.Dir(name)] != tar.TypeDir {
		// Not below a directory of this stream: its parent is missing,
		// came later, or is a symlink or a file.
		return nil, c.refuse("entry %q is not inside a directory of the copy", hdr.Name)
	}
	if _, dup := c.kinds[name]; dup {
		return nil, c.refuse("entry %q appears twice", hdr.Name)
	}
	out := &tar.Header{
		Typeflag: hdr.Typeflag,
		Name:     name,
		Mode:     hdr.Mode & 0o777, // set-user-ID, set-group-ID and sticky bits dropped
		Uid:      hdr.Uid,
		Gid:      hdr.Gid,
		ModTime:  hdr.ModTime,
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		c.topDir = c.topDir || top
	case tar.TypeReg: // the reader turns the old TypeRegA into TypeReg
		if hdr.Size > c.opt.Limits.Bytes-c.total {
			return nil, c.refuse("it holds more than %d bytes (raise it with --max-size)", c.opt.Limits.Bytes)
		}
		c.total += hdr.Size
		out.Size = hdr.Size
	case tar.TypeSymlink:
		if len(hdr.Linkname) > maxName || hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) {
			return nil, c.refuse("symlink %q has a bad target", hdr.Name)
		}
		out.Linkname = hdr.Linkname
	case tar.TypeLink:
		if top {
			return nil, c.refuse("the top entry %q is a hard link", hdr.Name)
		}
		target, err := c.local(hdr.Linkname)
		if err != nil {
			return nil, c.refuse("hard link %q points outside the copy", hdr.Name)
		}
		if k, ok := c.kinds[target]; !ok || k == tar.TypeDir {
			return nil, c.refuse("hard link %q must point at a file earlier in the copy", hdr.Name)
		}
		out.Linkname = target
	default:
		return nil, c.refuse("entry %q is a %s; only files, directories and links are copied", hdr.Name, typeName(hdr.Typeflag))
	}
	c.kinds[name] = hdr.Typeflag
	return out, nil
}

// local maps an entry name from the stream to its local name (opt.Name,
// or opt.Name/...), or refuses it.
func (c *checker) local(raw string) (string, error) {
	if len(raw) > maxName {
		return "", c.refuse("an entry name is longer than %d bytes", maxName)
	}
	n := path.Clean(raw)
	if raw != n && raw != n+"/" {
		return "", c.refuse("entry %q is not a clean name", raw)
	}
	if path.IsAbs(n) || n == ".." || strings.HasPrefix(n, "../") {
		return "", c.refuse("entry %q escapes the copy", raw)
	}
	var rest string
	switch {
	case n == c.opt.From:
	case c.opt.From == ".":
		rest = n
	case strings.HasPrefix(n, c.opt.From+"/"):
		rest = n[len(c.opt.From)+1:]
	default:
		return "", c.refuse("entry %q is outside %s, the path asked for", raw, c.opt.From)
	}
	if rest == "" {
		return c.opt.Name, nil
	}
	return c.opt.Name + "/" + rest, nil
}

func typeName(t byte) string {
	switch t {
	case tar.TypeChar:
		return "character device"
	case tar.TypeBlock:
		return "block device"
	case tar.TypeFifo:
		return "FIFO"
	}
	return fmt.Sprintf("tar entry of type %q", t)
}

// Check copies the tar stream r to w as a new tar stream, entry by entry,
// under the rules Extract applies (see there), with the entries named as
// in r (under opt.From; opt.Name is ignored) and set-id bits dropped. A
// stream that breaks a rule stops at the entry before: what reached w is
// a prefix of allowed entries, and the error says why. It is for callers
// that hand the stream on (the HTTP API, `smx agent cp NAME:/path -`)
// rather than extract it, so that their own extractors never see what the
// host would refuse. It returns the bytes of file content passed on.
func Check(w io.Writer, r io.Reader, opt Options) (int64, error) {
	if opt.From != "." && !plainName(opt.From) {
		return 0, fmt.Errorf("tarfs: cannot copy %q by its name: %w", opt.From, errdefs.ErrInvalid)
	}
	opt.Name = opt.From
	c := newChecker(opt, "the stream ends before the bad entry")
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	for {
		hdr, err := c.next(tr)
		if err == io.EOF {
			return c.total, tw.Close()
		}
		if err != nil {
			return c.total, err
		}
		if opt.From == "." {
			// Back to the stream's own spelling: "./" for the top, then
			// names relative to it.
			hdr.Name = strings.TrimPrefix(hdr.Name, "./")
			if hdr.Typeflag == tar.TypeLink {
				hdr.Linkname = strings.TrimPrefix(hdr.Linkname, "./")
			}
		}
		if hdr.Typeflag == tar.TypeDir {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return c.total, err
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return c.total, fmt.Errorf("tarfs: %s: %w", hdr.Name, err)
			}
		}
	}
}
