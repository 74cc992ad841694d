package ocisnap

import (
	"io"
	"os"
	"sync/atomic"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fileLayer is one blob of an artifact being pushed, read from a file
// whose digests are already known. The registry client opens it only to
// send it (it skips blobs the registry holds), so what is read from it is
// what went over the wire.
type fileLayer struct {
	l        Layer
	path     string
	sent     *atomic.Int64 // shared by every layer of a push
	opened   atomic.Bool
	progress func(sent int64)
}

func (f *fileLayer) Digest() (v1.Hash, error)            { return v1.NewHash(f.l.Digest) }
func (f *fileLayer) DiffID() (v1.Hash, error)            { return v1.NewHash(f.l.DiffID) }
func (f *fileLayer) Size() (int64, error)                { return f.l.Size, nil }
func (f *fileLayer) MediaType() (types.MediaType, error) { return types.MediaType(f.l.MediaType), nil }

func (f *fileLayer) Compressed() (io.ReadCloser, error) {
	r, err := os.Open(f.path)
	if err != nil {
		return nil, err
	}
	f.opened.Store(true)
	return &countingReader{r: r, f: f}, nil
}

// Uncompressed is not used by a push; the blob as stored is what is sent.
func (f *fileLayer) Uncompressed() (io.ReadCloser, error) { return f.Compressed() }

type countingReader struct {
	r *os.File
	f *fileLayer
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		total := c.f.sent.Add(int64(n))
		if c.f.progress != nil {
			c.f.progress(total)
		}
	}
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }
