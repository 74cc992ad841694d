package cache

import (
	"archive/tar"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Limits bound one promotion: the guest's tar stream is hostile input.
type Limits struct {
	FileBytes  int64 // largest single entry taken
	TotalBytes int64 // bytes read from the stream before the rest is dropped
	Entries    int   // tar headers read before the rest is dropped
}

// DefaultLimits suit npm caches of large projects.
var DefaultLimits = Limits{FileBytes: 1 << 30, TotalBytes: 16 << 30, Entries: 1 << 20}

// Result is what one promotion did.
type Result struct {
	Promoted int      `json:"promoted"`          // new entries whose bytes matched their name
	Bytes    int64    `json:"bytes"`             // their size
	Present  int      `json:"present,omitempty"` // verified entries the cache had already
	Refused  []string `json:"refused,omitempty"` // entries whose bytes did not match their name (first 20)
	Refusals int      `json:"refusals,omitempty"`
	Ignored  int      `json:"ignored,omitempty"` // entries that are not content (directories, links, other names)
}

// contentRE matches an entry of the copied-out content-v2 folder: its
// algorithm, then the hex digest split 2/2/rest as npm's cacache writes it.
var contentRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^content-v2/(sha512|sha384|sha256|sha1)/([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{36,124})$`)
})

func newHash(algo string) (hash.Hash, int) {
	switch algo {
	case "sha512":
		return sha512.New(), sha512.Size
	case "sha384":
		return sha512.New384(), sha512.Size384
	case "sha256":
		return sha256.New(), sha256.Size
	case "sha1":
		return sha1.New(), sha1.Size
	}
	return nil, 0
}

// Promote reads a tar stream of what a guest wrote over a cache (entries
// named under prefix; npm's store is prefix+"_cacache/content-v2/...")
// and adds to the cache at data every regular file of npm's
// content-addressed store whose bytes hash to the digest its path names,
// at the same place. Everything else is
// ignored; an entry whose bytes do not match is refused and never written
// where npm looks. Files are written beneath data only (os.Root), to a
// temporary name, then renamed into place, so a reader never sees part of
// one. An error ends the promotion; what was verified before it stays.
func Promote(data string, r io.Reader, prefix string, lim Limits) (Result, error) {
	var res Result
	root, err := os.OpenRoot(data)
	if err != nil {
		return res, fmt.Errorf("cache: %w", err)
	}
	defer root.Close()
	if err := root.MkdirAll("_cacache/tmp", 0o755); err != nil {
		return res, fmt.Errorf("cache: %w", err)
	}
	lr := &io.LimitedReader{R: r, N: lim.TotalBytes}
	tr := tar.NewReader(lr)
	buf := make([]byte, 256<<10)
	for n := 0; ; n++ {
		if n >= lim.Entries {
			return res, fmt.Errorf("cache: promote: more than %d entries: the rest is dropped", lim.Entries)
		}
		h, err := tr.Next()
		if err == io.EOF {
			return res, nil
		}
		if err != nil {
			if lr.N <= 0 {
				return res, fmt.Errorf("cache: promote: more than %d bytes: the rest is dropped", lim.TotalBytes)
			}
			return res, fmt.Errorf("cache: promote: %w", err)
		}
		name, ok := strings.CutPrefix(h.Name, prefix+"_cacache/")
		m := contentRE().FindStringSubmatch(name)
		if !ok || h.Typeflag != tar.TypeReg || m == nil {
			res.Ignored++
			continue
		}
		algo, digest := m[1], m[2]+m[3]+m[4]
		hh, size := newHash(algo)
		if len(digest) != 2*size {
			res.Ignored++
			continue
		}
		if h.Size > lim.FileBytes {
			res.refuse(strings.TrimPrefix(h.Name, prefix), "larger than "+strconv.FormatInt(lim.FileBytes, 10)+" bytes")
			continue
		}
		final := "_cacache/" + name
		if fi, err := root.Lstat(final); err == nil && fi.Mode().IsRegular() {
			// Content-addressed: what is there was verified when it came.
			res.Present++
			continue
		}
		tmp := "_cacache/tmp/smx-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.Itoa(n)
		f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return res, fmt.Errorf("cache: promote: %w", err)
		}
		written, err := io.CopyBuffer(io.MultiWriter(f, hh), io.LimitReader(tr, h.Size), buf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil && written != h.Size {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			root.Remove(tmp)
			return res, fmt.Errorf("cache: promote %s: %w", h.Name, err)
		}
		if got := hex.EncodeToString(hh.Sum(nil)); got != digest {
			root.Remove(tmp)
			res.refuse(strings.TrimPrefix(h.Name, prefix), algo+" of its bytes is "+got)
			continue
		}
		if err := root.MkdirAll("_cacache/content-v2/"+algo+"/"+m[2]+"/"+m[3], 0o755); err != nil {
			root.Remove(tmp)
			return res, fmt.Errorf("cache: promote: %w", err)
		}
		if err := root.Rename(tmp, final); err != nil {
			root.Remove(tmp)
			return res, fmt.Errorf("cache: promote: %w", err)
		}
		res.Promoted++
		res.Bytes += h.Size
	}
}

func (r *Result) refuse(name, why string) {
	r.Refusals++
	if len(r.Refused) < 20 {
		r.Refused = append(r.Refused, name+" ("+why+")")
	}
}
