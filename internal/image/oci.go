package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Import makes an image from an OCI/Docker image on the local disk. ref is
// "docker-archive:FILE" (what `docker save` writes) or "oci-layout:DIR";
// from a layout the first linux/amd64 image is taken. The layers are
// flattened with their whiteouts applied, and the image config's Env,
// WorkingDir, User, Entrypoint and Cmd are kept in Image.Config.
func (s *Store) Import(ctx context.Context, name, ref string, progress io.Writer) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	kind, loc, _ := strings.Cut(ref, ":")
	if loc == "" || (kind != "docker-archive" && kind != "oci-layout" && kind != "dir") {
		return nil, fmt.Errorf("image: import %s: unsupported reference %q: use docker-archive:FILE, oci-layout:DIR or dir:ROOTFS: %w", name, ref, errdefs.ErrInvalid)
	}
	abs, err := filepath.Abs(loc)
	if err != nil {
		return nil, fmt.Errorf("image: import %s: %w", name, err)
	}
	if _, err := os.Stat(abs); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("image: import %s: %s does not exist: check the path: %w", name, abs, errdefs.ErrNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("image: import %s: %w", name, err)
	}
	source := kind + ":" + abs
	if err := checkTools("mkfs.ext4", "qemu-img"); err != nil {
		return nil, fmt.Errorf("image: import %s: %w", name, err)
	}
	if err := s.checkFree(name); err != nil {
		return nil, err
	}

	if kind == "dir" {
		return s.importDir(ctx, name, source, abs, progress)
	}
	var img v1.Image
	if kind == "docker-archive" {
		img, err = dockerArchiveImage(abs)
	} else {
		img, err = layoutImage(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("image: import %s: %s: %w", name, source, err)
	}
	return s.importImage(ctx, name, source, img, progress)
}

// importImage flattens img into a new image called name.
func (s *Store) importImage(ctx context.Context, name, source string, img v1.Image, progress io.Writer) (*Image, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: import %s: %s: read config: %v: %w", name, source, err, errdefs.ErrInvalid)
	}
	// Guests are x86-64 Linux; anything else would fail at the first exec.
	if (cf.OS != "" && cf.OS != "linux") || (cf.Architecture != "" && cf.Architecture != "amd64") {
		return nil, fmt.Errorf("image: import %s: %s is %s/%s: smx runs linux/amd64 images; pull or save that platform: %w", name, source, cf.OS, cf.Architecture, errdefs.ErrInvalid)
	}

	b, err := s.begin(name, progress)
	if err != nil {
		return nil, err
	}
	defer b.abort()
	b.logf("extracting %s", source)
	if err := extractImage(ctx, b, img); err != nil {
		return nil, fmt.Errorf("image: import %s: extract: %w", name, err)
	}
	if err := ensureGuestDirs(b.tree); err != nil {
		return nil, fmt.Errorf("image: import %s: %w", name, err)
	}
	c := cf.Config
	cfg := &OCIConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Entrypoint: c.Entrypoint, Cmd: c.Cmd}
	return b.finish(ctx, source, largeSizing, cfg)
}

func dockerArchiveImage(file string) (v1.Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(file) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, fmt.Errorf("not a docker archive (%v): create one with `docker save IMAGE -o FILE`: %w", err, errdefs.ErrInvalid)
	}
	if len(m) != 1 {
		// With several images the choice would be a guess; make the user pick.
		var tags []string
		for _, d := range m {
			tags = append(tags, d.RepoTags...)
		}
		return nil, fmt.Errorf("archive holds %d images (%s): save just one with `docker save IMAGE:TAG -o FILE`: %w", len(m), strings.Join(tags, ", "), errdefs.ErrInvalid)
	}
	img, err := tarball.Image(opener, nil)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalid)
	}
	return img, nil
}

func layoutImage(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("not an OCI layout (%v): %w", err, errdefs.ErrInvalid)
	}
	img, err := pickImage(idx, 0)
	if err != nil {
		return nil, err
	}
	return img, nil
}

// pickImage returns the first image in idx (searching nested indexes) whose
// descriptor is for linux/amd64 or names no platform (single-image layouts
// often do not). The config's platform is checked again by the caller.
func pickImage(idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, fmt.Errorf("image indexes nested too deep: %w", errdefs.ErrInvalid)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read index: %v: %w", err, errdefs.ErrInvalid)
	}
	for _, d := range im.Manifests {
		if p := d.Platform; p != nil && (p.OS != "linux" || p.Architecture != "amd64") {
			continue
		}
		switch {
		case d.MediaType.IsImage():
			return idx.Image(d.Digest)
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			if img, err := pickImage(child, depth+1); err == nil {
				return img, nil
			}
		}
	}
	return nil, fmt.Errorf("no linux/amd64 image in the layout: %w", errdefs.ErrNotFound)
}

// extractImage writes the flattened filesystem of img into the build tree.
func extractImage(ctx context.Context, b *build, img v1.Image) error {
	rc := mutate.Extract(img)
	// Closing the reader is what stops Extract's writer goroutine, both on
	// error and on cancellation.
	defer rc.Close()
	stop := context.AfterFunc(ctx, func() { rc.Close() })
	defer stop()
	x := extractor{t: b.tree}
	err := x.run(rc)
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if err != nil {
		return err
	}
	if x.skipped > 0 {
		b.logf("skipped %d device nodes, FIFOs and sockets (the guest mounts its own /dev)", x.skipped)
	}
	if x.badLinks > 0 {
		b.logf("skipped %d hard links whose target is not a regular file in the image", x.badLinks)
	}
	return nil
}

// extractor unpacks a flattened image tar stream into a tree.
//
// The stream comes from mutate.Extract, which has already applied
// whiteouts, dropped relative links that climb out of the root, and emits
// each path at most once, upper layers first. So an entry whose path already
// exists lost to an upper layer that created that path implicitly (as the
// parent of one of its files) and is skipped.
//
// Nothing in the stream can write outside the tree: paths are cleaned to
// stay below /, symlinks met on the way to an entry are resolved the way the
// guest will see them (an absolute target starts again at the tree's root),
// and all file operations go through an os.Root as a second fence.
type extractor struct {
	t        *tree
	links    []*tar.Header // hard links, made last: their targets may come later
	skipped  int
	badLinks int
}

func (x *extractor) run(r io.Reader) error {
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := x.entry(hdr, tr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	for _, hdr := range x.links {
		if err := x.link(hdr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	return nil
}

// inRoot turns an archive name into a clean path relative to the root, ""
// for the root itself.
func inRoot(name string) string {
	return strings.TrimPrefix(path.Clean("/"+name), "/")
}

// place resolves the parent directory of an archive name and returns the
// path the entry will have, without symlinks in its parent.
func (x *extractor) place(name string) (string, error) {
	rel := inRoot(name)
	if rel == "" {
		return "", nil
	}
	dir, err := x.t.resolve(path.Dir(rel))
	if err != nil {
		return "", err
	}
	return path.Join(dir, path.Base(rel)), nil
}

func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	if strings.HasPrefix(path.Base(hdr.Name), ".wh.") {
		return nil // whiteouts were applied by mutate.Extract
	}
	rel, err := x.place(hdr.Name)
	if err != nil || rel == "" {
		return err // the root's own attributes come from mkfs (root_owner=0:0)
	}
	fi, statErr := x.t.root.Lstat(rel)
	exists := statErr == nil
	mode := hdr.FileInfo().Mode()
	perm := mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if exists && !fi.IsDir() {
			return nil
		}
		return x.t.mkdir(rel, perm, hdr.Uid, hdr.Gid)
	case tar.TypeReg, tar.TypeRegA:
		if exists {
			return nil
		}
		if err := x.t.writeFile(rel, r, perm, hdr.Uid, hdr.Gid); err != nil {
			return err
		}
		// Keep mtimes: Python and make compare them with their caches.
		return x.t.root.Chtimes(rel, hdr.ModTime, hdr.ModTime)
	case tar.TypeSymlink:
		if exists {
			return nil
		}
		return x.t.symlink(hdr.Linkname, rel, hdr.Uid, hdr.Gid)
	case tar.TypeLink:
		h := *hdr
		h.Name = rel
		x.links = append(x.links, &h)
		return nil
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		x.skipped++
		return nil
	default:
		return nil // PAX/GNU metadata records, already folded into hdr
	}
}

func (x *extractor) link(hdr *tar.Header) error {
	if _, err := x.t.root.Lstat(hdr.Name); err == nil {
		return nil
	}
	old, err := x.place(hdr.Linkname)
	if err != nil {
		return err
	}
	fi, err := x.t.root.Lstat(old)
	if err != nil || !fi.Mode().IsRegular() {
		x.badLinks++
		return nil
	}
	return x.t.link(old, hdr.Name)
}

// resolve follows symlinks in the directory path dir (relative to the
// root) the way the guest kernel would after the root is mounted: an
// absolute target restarts at the root and ".." stops at the root. Missing
// components are fine (they will be created). The result has no symlinks
// in it.
func (t *tree) resolve(dir string) (string, error) {
	var done string
	rest := strings.Split(dir, "/")
	for hops := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			done = strings.TrimPrefix(path.Dir("/"+done), "/")
			continue
		}
		next := path.Join(done, c)
		fi, err := t.root.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			done = next
		case err != nil:
			return "", err
		case fi.Mode()&fs.ModeSymlink != 0:
			if hops++; hops > 40 {
				return "", fmt.Errorf("%s: too many levels of symbolic links", dir)
			}
			target, err := t.root.Readlink(next)
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				done = ""
			}
			rest = append(strings.Split(target, "/"), rest...)
		case fi.IsDir():
			done = next
		default:
			return "", fmt.Errorf("%s: %s is not a directory", dir, next)
		}
	}
	if done == "" {
		return ".", nil
	}
	return done, nil
}
