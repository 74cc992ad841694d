package image

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// importDir makes an image from an unpacked root filesystem (a container
// bundle's rootfs, as containerd mounts it). The directory is streamed
// as a tar through the same extractor as an OCI image, so the same
// fences apply: nothing it holds (a symlink to /etc, say) can make the
// build write outside its tree. Hard links are copied as separate files,
// devices, FIFOs and sockets skipped.
func (s *Store) importDir(ctx context.Context, name, source, dir string, progress io.Writer) (*Image, error) {
	b, err := s.begin(name, progress)
	if err != nil {
		return nil, err
	}
	defer b.abort()
	b.logf("copying %s", source)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarDir(ctx, dir, pw)) }()
	x := extractor{t: b.tree}
	err = x.run(pr)
	pr.CloseWithError(io.ErrClosedPipe)
	if err != nil {
		return nil, fmt.Errorf("image: import %s: copy %s: %w", name, dir, err)
	}
	if err := ensureGuestDirs(b.tree); err != nil {
		return nil, fmt.Errorf("image: import %s: %w", name, err)
	}
	return b.finish(ctx, source, largeSizing, nil)
}

// tarDir writes the tree under dir to w as a tar stream, paths relative
// to dir, symlinks not followed.
func tarDir(ctx context.Context, dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil // a socket: nothing a guest could use
		}
		hdr.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname = "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, hdr.Size)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
