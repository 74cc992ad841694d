package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// tree is a root directory being populated for mkfs.ext4 -d.
//
// mkfs.ext4 -d copies owners and modes from the host files. When smx runs
// as root the tree simply holds the real owners. When it does not, it cannot
// chown, so the tree records the wanted owner and mode of every entry in
// attrs, keeps host modes readable for mkfs, and fixupOwners rewrites the
// inodes in the finished ext4 with debugfs.
type tree struct {
	dir        string
	root       *os.Root
	privileged bool
	attrs      map[string]attr // by slash path relative to dir; only when !privileged
}

// attr is the wanted ownership and full st_mode (type bits included) of an
// entry in an unprivileged tree.
type attr struct {
	uid, gid int
	mode     uint32
}

func newTree(dir string, privileged bool) (*tree, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	t := &tree{dir: dir, root: r, privileged: privileged}
	if !privileged {
		t.attrs = map[string]attr{}
	}
	return t, nil
}

func (t *tree) Close() error { return t.root.Close() }

// unixMode turns an fs.FileMode into the st_mode bits ext4 stores.
func unixMode(m fs.FileMode) uint32 {
	u := uint32(m.Perm())
	switch {
	case m.IsDir():
		u |= syscall.S_IFDIR
	case m&fs.ModeSymlink != 0:
		u |= syscall.S_IFLNK
	default:
		u |= syscall.S_IFREG
	}
	if m&fs.ModeSetuid != 0 {
		u |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		u |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		u |= syscall.S_ISVTX
	}
	return u
}

// setAttr gives the entry at rel (which must exist and not be reached
// through a symlink) its owner and mode. mode carries the type bit
// (fs.ModeDir, fs.ModeSymlink or none for a regular file).
func (t *tree) setAttr(rel string, mode fs.FileMode, uid, gid int) error {
	isLink := mode&fs.ModeSymlink != 0
	if t.privileged {
		if err := t.root.Lchown(rel, uid, gid); err != nil {
			return err
		}
		if isLink {
			return nil // symlink modes mean nothing on Linux
		}
		// chown clears set-id bits, so chmod comes second.
		return t.root.Chmod(rel, mode)
	}
	t.attrs[rel] = attr{uid: uid, gid: gid, mode: unixMode(mode)}
	if isLink {
		return nil
	}
	// Keep the host copy readable (and dirs enterable) by us so that mkfs
	// can read it; the exact mode goes into the ext4 via debugfs.
	host := mode & (fs.ModePerm | fs.ModeSticky)
	if mode.IsDir() {
		host |= 0o700
	} else {
		host |= 0o600
	}
	return t.root.Chmod(rel, host)
}

// mkdir creates directory rel (and any missing parents, owned by root with
// mode 0755), or updates its attributes if it exists.
func (t *tree) mkdir(rel string, perm fs.FileMode, uid, gid int) error {
	if err := t.mkParents(rel); err != nil {
		return err
	}
	if err := t.root.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return t.setAttr(rel, fs.ModeDir|perm, uid, gid)
}

// mkParents creates the missing parent directories of rel, each owned by
// root with mode 0755: the attributes a layer that omits its parent
// directories implies.
func (t *tree) mkParents(rel string) error {
	dir := path.Dir(rel)
	if dir == "." {
		return nil
	}
	var missing []string
	for d := dir; d != "."; d = path.Dir(d) {
		if _, err := t.root.Lstat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	for _, d := range slices.Backward(missing) {
		if err := t.root.Mkdir(d, 0o755); err != nil {
			return err
		}
		if err := t.setAttr(d, fs.ModeDir|0o755, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

// writeFile creates regular file rel with the contents of r.
func (t *tree) writeFile(rel string, r io.Reader, perm fs.FileMode, uid, gid int) error {
	if err := t.mkParents(rel); err != nil {
		return err
	}
	f, err := t.root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return t.setAttr(rel, perm, uid, gid)
}

func (t *tree) writeString(rel, s string, perm fs.FileMode) error {
	return t.writeFile(rel, strings.NewReader(s), perm, 0, 0)
}

// symlink creates symlink rel pointing at target (not interpreted).
func (t *tree) symlink(target, rel string, uid, gid int) error {
	if err := t.mkParents(rel); err != nil {
		return err
	}
	if err := t.root.Symlink(target, rel); err != nil {
		return err
	}
	return t.setAttr(rel, fs.ModeSymlink|0o777, uid, gid)
}

// link creates rel as a hard link to the regular file old.
func (t *tree) link(old, rel string) error {
	if err := t.mkParents(rel); err != nil {
		return err
	}
	if err := t.root.Link(old, rel); err != nil {
		return err
	}
	if !t.privileged {
		t.attrs[rel] = t.attrs[old]
	}
	return nil
}

// walk calls fn for every entry below the root in lexical order (so the
// order is the same on every host), with the entry's slash path relative to
// the root, its wanted mode and owner.
func (t *tree) walk(ctx context.Context, fn func(rel string, fi fs.FileInfo, a attr) error) error {
	return filepath.WalkDir(t.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == t.dir {
			return nil
		}
		rel := filepath.ToSlash(p[len(t.dir)+1:])
		fi, err := d.Info()
		if err != nil {
			return err
		}
		a, ok := t.attrs[rel]
		if !ok {
			st := fi.Sys().(*syscall.Stat_t)
			a = attr{uid: int(st.Uid), gid: int(st.Gid), mode: st.Mode}
		}
		return fn(rel, fi, a)
	})
}

// treeStats are what sizing the filesystem needs.
type treeStats struct {
	bytes   int64 // data, rounded up to 4 KiB blocks
	entries int64
}

// digest hashes the tree and measures it in one pass.
//
// The hash is SHA-256 over a domain-separated, length-prefixed record per
// entry, in lexical path order: path, st_mode (type, permissions, set-id and
// sticky bits), uid, gid, then the SHA-256 of a regular file's contents or a
// symlink's target. Timestamps, xattrs and hard-link structure are left out:
// they vary between builds of the same content (or do not matter to the
// guest), and the digest is meant to say "same files".
func (t *tree) digest(ctx context.Context) (string, treeStats, error) {
	h := sha256.New()
	io.WriteString(h, "smx-image-tree-v1\x00")
	var st treeStats
	field := func(s string) { fmt.Fprintf(h, "%d:%s", len(s), s) }
	err := t.walk(ctx, func(rel string, fi fs.FileInfo, a attr) error {
		st.entries++
		st.bytes += (fi.Size() + 4095) &^ 4095
		field(rel)
		field(fmt.Sprintf("%o %d %d", a.mode, a.uid, a.gid))
		switch {
		case fi.Mode().IsRegular():
			sum, err := t.fileSum(rel)
			if err != nil {
				return err
			}
			field(sum)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := t.root.Readlink(rel)
			if err != nil {
				return err
			}
			field(target)
		default:
			field("")
		}
		return nil
	})
	if err != nil {
		return "", st, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), st, nil
}

func (t *tree) fileSum(rel string) (string, error) {
	f, err := t.root.Open(rel)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fh := sha256.New()
	if _, err := io.Copy(fh, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(fh.Sum(nil)), nil
}

// debugfsScript returns the debugfs commands that give every recorded entry
// its wanted owner and mode inside the ext4 image.
func (t *tree) debugfsScript() (string, error) {
	var b strings.Builder
	for _, rel := range slices.Sorted(maps.Keys(t.attrs)) {
		if strings.ContainsAny(rel, "\n\r") {
			return "", fmt.Errorf("path %q contains a line break, which debugfs cannot take: build as root", rel)
		}
		// debugfs reads "" inside a quoted argument as one literal quote.
		q := `"/` + strings.ReplaceAll(rel, `"`, `""`) + `"`
		a := t.attrs[rel]
		fmt.Fprintf(&b, "sif %s uid %d\nsif %s gid %d\nsif %s mode 0%o\n", q, a.uid, q, a.gid, q, a.mode)
	}
	return b.String(), nil
}
