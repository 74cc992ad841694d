package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/smx-dev/smx/internal/errdefs"
)

// PullResult is what Pull made and from which exact manifest.
type PullResult struct {
	Image *Image
	// Pinned is REPOSITORY@sha256:... of the manifest that was pulled: the
	// reference to use for the same content again, whatever the tag
	// points to later.
	Pinned string
}

// Pull fetches ref (a registry reference: NAME[:TAG] or NAME@sha256:...)
// for linux/amd64 with go-containerregistry and flattens it into a new
// image called name (as Import does). A digest in ref is verified against
// the manifest the registry serves. Layer progress goes to progress. The
// image's Source is the pinned reference.
func (s *Store) Pull(ctx context.Context, name, ref string, progress io.Writer) (*PullResult, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	r, err := parseRef(ref)
	if err != nil {
		return nil, fmt.Errorf("image: pull %s: %q is not an image reference (%v): say e.g. debian:bookworm or registry.example/team/img@sha256:...: %w", name, ref, err, errdefs.ErrInvalid)
	}
	if err := checkTools("mkfs.ext4", "qemu-img"); err != nil {
		return nil, fmt.Errorf("image: pull %s: %w", name, err)
	}
	if err := s.checkFree(name); err != nil {
		return nil, err
	}
	fmt.Fprintf(progress, "image: resolving %s\n", r.Name())
	img, err := remote.Image(r, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}))
	if err != nil {
		return nil, fmt.Errorf("image: pull %s: %s: %w", name, ref, classifyRemote(err))
	}
	dig, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("image: pull %s: %s: %w", name, ref, classifyRemote(err))
	}
	pinned := r.Context().Name() + "@" + dig.String()
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("image: pull %s: %s: %w", name, ref, classifyRemote(err))
	}
	var total int64
	for _, l := range layers {
		if n, err := l.Size(); err == nil {
			total += n
		}
	}
	fmt.Fprintf(progress, "image: %s: %d layers, %s compressed\n", pinned, len(layers), mibString(total))
	im, err := s.importImage(ctx, name, "registry:"+pinned, &progressImage{Image: img, layers: layers, w: progress}, progress)
	if err != nil {
		return nil, err
	}
	return &PullResult{Image: im, Pinned: pinned}, nil
}

func parseRef(ref string) (name.Reference, error) {
	if strings.TrimSpace(ref) == "" || strings.ContainsAny(ref, " \t\n") {
		return nil, errors.New("empty or contains spaces")
	}
	return name.ParseReference(ref, name.WithDefaultRegistry("index.docker.io"))
}

// classifyRemote maps registry errors onto smx's error classes.
func classifyRemote(err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusNotFound:
			return fmt.Errorf("%v: %w", err, errdefs.ErrNotFound)
		case http.StatusUnauthorized, http.StatusForbidden:
			return fmt.Errorf("%v (log in with `docker login`; smx reads its credentials): %w", err, errdefs.ErrDenied)
		}
	}
	if strings.Contains(err.Error(), "no child with platform") {
		return fmt.Errorf("%v: smx runs linux/amd64 images: %w", err, errdefs.ErrInvalid)
	}
	return err
}

func mibString(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// progressImage reports each layer's download as mutate.Extract reads it.
type progressImage struct {
	v1.Image
	layers []v1.Layer
	w      io.Writer
}

func (p *progressImage) Layers() ([]v1.Layer, error) {
	out := make([]v1.Layer, len(p.layers))
	for i, l := range p.layers {
		out[i] = &progressLayer{Layer: l, i: i + 1, n: len(p.layers), w: p.w}
	}
	return out, nil
}

type progressLayer struct {
	v1.Layer
	i, n int
	w    io.Writer
}

func (l *progressLayer) Uncompressed() (io.ReadCloser, error) {
	rc, err := l.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	d, _ := l.Digest()
	size, _ := l.Size()
	short := d.Hex
	if len(short) > 12 {
		short = short[:12]
	}
	fmt.Fprintf(l.w, "image: layer %d/%d %s (%s compressed)\n", l.i, l.n, short, mibString(size))
	return &countingReader{ReadCloser: rc, w: l.w, label: fmt.Sprintf("layer %d/%d", l.i, l.n), start: time.Now()}, nil
}

// countingReader prints how far a layer is, every 32 MiB and at its end.
type countingReader struct {
	io.ReadCloser
	w     io.Writer
	label string
	n     int64
	next  int64
	start time.Time
	done  bool
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n += int64(n)
	if c.n >= c.next+32<<20 {
		c.next = c.n
		fmt.Fprintf(c.w, "image: %s: %s unpacked\n", c.label, mibString(c.n))
	}
	if err == io.EOF && !c.done {
		c.done = true
		fmt.Fprintf(c.w, "image: %s: done, %s in %s\n", c.label, mibString(c.n), time.Since(c.start).Round(time.Millisecond))
	}
	return n, err
}
