package shim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

// rootImage returns the smx image of the tree at rootfs, importing it
// when no image of the same content exists yet in the task's containerd
// namespace.
func (s *Shim) rootImage(ctx context.Context, rootfs string) (string, error) {
	key, err := treeKey(ctx, s.ns, rootfs)
	if err != nil {
		return "", fmt.Errorf("smx shim: hash rootfs: %w", err)
	}
	// 192 bits, and longer than the names of the metadata-keyed
	// imports before, which are never reused.
	name := "ctr-" + key[:48]
	if _, err := s.svc.InspectImage(ctx, name); err == nil {
		return name, nil
	}
	_, err = s.svc.ImportImage(ctx, service.ImageImportRequest{Name: name, Ref: "dir:" + rootfs})
	if errors.Is(err, errdefs.ErrExists) {
		err = nil // another shim imported the same content meanwhile
	}
	return name, err
}

// treeKey names a root file system's content in containerd namespace ns:
// a SHA-256 over every entry's name, type, mode, owner, device number,
// link target and, for a regular file, the SHA-256 of its bytes (and its
// time: the import keeps it). It is what decides that a pod boots an
// image imported for another pod, so it reads the contents: a key on
// metadata alone let a pod author craft an image whose names, sizes and
// times equal a public image's, run it first, and have the node boot its
// bytes for every later pod of the public image. The namespace keeps one
// tenant's imports out of another's. Directories' sizes and times are
// left out: a snapshot's root is a fresh upper directory for every
// container, and the import does not keep them either.
func treeKey(ctx context.Context, ns, root string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "smx-shim-rootfs-v2\x00%d:%s", len(ns), ns)
	buf := make([]byte, 256<<10)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		st, _ := fi.Sys().(*syscall.Stat_t)
		var uid, gid uint32
		var rdev uint64
		if st != nil {
			uid, gid, rdev = st.Uid, st.Gid, st.Rdev
		}
		link, sum, mtime := "", "", int64(0)
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if sum, err = fileSum(p, buf); err != nil {
				return err
			}
			mtime = fi.ModTime().UnixNano()
		}
		fmt.Fprintf(h, "%d:%s %o %d %d %d %d %d:%s %s\n", len(rel), rel, fi.Mode(), uid, gid, rdev, mtime, len(link), link, sum)
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// fileSum hashes a regular file's bytes, opened without following a link.
func fileSum(p string, buf []byte) (string, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyBuffer(h, struct{ io.Reader }{f}, buf); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
