package cache

import (
	"archive/tar"
	"bytes"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Use
	}{
		{"npm", Use{Name: "npm", Guest: "/home/user/.npm"}},
		{"npm:shared", Use{Name: "npm", Guest: "/home/user/.npm", Mode: ModeShared}},
		{"pip:ro", Use{Name: "pip", Guest: "/home/user/.cache/pip", Mode: ModeRO}},
		{"mine:/data/c", Use{Name: "mine", Guest: "/data/c"}},
		{"mine:~/.cache/x:shared", Use{Name: "mine", Guest: "/home/user/.cache/x", Mode: ModeShared}},
		{"go:shared:/srv/mod", Use{Name: "go", Guest: "/srv/mod", Mode: ModeShared}},
	} {
		got, err := Parse(c.in, "/home/user")
		if err != nil || got != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "mine", "NPM", "npm:rw", "npm:ro:shared", "x:/a:/b", "x:rel/path", "x:/etc/x", "x:/run", "x:/a/../b", "a:b:c:d", "x:/"} {
		if _, err := Parse(in, "/root"); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Parse(%q) = %v; want ErrInvalid", in, err)
		}
	}
}

func TestEnsureKeepsMode(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	u, err := s.Ensure(Use{Name: "npm", Guest: "/root/.npm"})
	if err != nil || u.Mode != ModeRO {
		t.Fatalf("Ensure = %+v, %v; want mode ro", u, err)
	}
	if _, err := s.Ensure(Use{Name: "npm", Guest: "/root/.npm", Mode: ModeShared}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("a read-only cache used as shared: %v; want ErrInvalid", err)
	}
	if u, err := s.Ensure(Use{Name: "npm", Guest: "/x"}); err != nil || u.Mode != ModeRO {
		t.Fatalf("Ensure again = %+v, %v", u, err)
	}
	l, err := s.List()
	if err != nil || len(l) != 1 || l[0].Name != "npm" || l[0].Mode != ModeRO {
		t.Fatalf("List = %+v, %v", l, err)
	}
	if err := s.Remove("npm"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get("npm"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get after Remove: %v", err)
	}
}

type entry struct {
	name string
	typ  byte
	body []byte
	link string
}

func tarOf(t *testing.T, es []entry) *bytes.Buffer {
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body)), Linkname: e.link}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			w.Write(e.body)
		}
	}
	w.Close()
	return &b
}

func contentPath(body []byte) string {
	sum := sha512.Sum512(body)
	h := hex.EncodeToString(sum[:])
	return "_cacache/content-v2/sha512/" + h[:2] + "/" + h[2:4] + "/" + h[4:]
}

// TestPromoteVerifies: only entries whose bytes match their name reach the
// cache; a poisoned entry (a real package's name, other bytes), links,
// names outside content-v2 and index entries never do.
func TestPromoteVerifies(t *testing.T) {
	data := t.TempDir()
	good, real, evil := []byte("a real tarball"), []byte("the package a lockfile names"), []byte("malware")
	poisoned := contentPath(real)
	es := []entry{
		{name: "_cacache/content-v2/", typ: tar.TypeDir},
		{name: contentPath(good), typ: tar.TypeReg, body: good},
		{name: poisoned, typ: tar.TypeReg, body: evil},
		{name: "_cacache/content-v2/sha512/aa/bb/../../../../index-v5/x", typ: tar.TypeReg, body: evil},
		{name: "_cacache/index-v5/00/11/key", typ: tar.TypeReg, body: evil},
		{name: contentPath([]byte("link")), typ: tar.TypeSymlink, link: "/etc/passwd"},
	}
	res, err := Promote(data, tarOf(t, es), "", DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if res.Promoted != 1 || res.Refusals != 1 || res.Ignored != 4 {
		t.Fatalf("Promote = %+v; want 1 promoted, 1 refused, 4 ignored", res)
	}
	if b, err := os.ReadFile(filepath.Join(data, contentPath(good))); err != nil || !bytes.Equal(b, good) {
		t.Fatalf("promoted entry: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(data, poisoned)); err == nil {
		t.Fatal("the poisoned entry reached the cache")
	}
	var files []string
	filepath.WalkDir(data, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 1 {
		t.Fatalf("cache holds %v; want only the verified entry", files)
	}
	// Again: already present, nothing new.
	res, err = Promote(data, tarOf(t, es[:2]), "", DefaultLimits)
	if err != nil || res.Promoted != 0 || res.Present != 1 {
		t.Fatalf("second Promote = %+v, %v", res, err)
	}
}

func TestPromoteLimits(t *testing.T) {
	data := t.TempDir()
	big := bytes.Repeat([]byte("x"), 4096)
	res, err := Promote(data, tarOf(t, []entry{{name: contentPath(big), typ: tar.TypeReg, body: big}}), "", Limits{FileBytes: 1024, TotalBytes: 1 << 20, Entries: 10})
	if err != nil || res.Promoted != 0 || res.Refusals != 1 {
		t.Fatalf("oversized entry: %+v, %v", res, err)
	}
	if _, err := Promote(data, tarOf(t, []entry{{name: contentPath(big), typ: tar.TypeReg, body: big}}), "", Limits{FileBytes: 1 << 20, TotalBytes: 2048, Entries: 10}); err == nil {
		t.Fatal("a stream over TotalBytes was taken")
	}
}
