package tarfs

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type entry struct {
	name, link, body string
	typ              byte
	mode             int64
}

func archive(t *testing.T, entries ...entry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if e.mode == 0 {
			e.mode = 0o644
		}
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Size: int64(len(e.body))}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	tw.Close()
	return &buf
}

func TestPackExtractRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "d", "e"), 0o750)
	os.WriteFile(filepath.Join(src, "d", "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "d", "e", "f.txt"), []byte("data"), 0o600)
	os.Symlink("e/f.txt", filepath.Join(src, "d", "link"))
	var buf bytes.Buffer
	if err := Pack(&buf, filepath.Join(src, "d"), "d"); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if _, err := Extract(&buf, dst, Options{Rename: "copy"}); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"copy": 0o750 | os.ModeDir, "copy/run.sh": 0o755, "copy/e/f.txt": 0o600} {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
	}
	if l, _ := os.Readlink(filepath.Join(dst, "copy", "link")); l != "e/f.txt" {
		t.Errorf("symlink target %q", l)
	}
}

// TestExtractRefusesEscapes feeds the archives a hostile guest could send
// back through `smx agent cp NAME:/path DST`.
func TestExtractRefusesEscapes(t *testing.T) {
	cases := map[string][]entry{
		"dotdot":          {{name: "../evil", typ: tar.TypeReg, body: "x"}},
		"nested dotdot":   {{name: "a/../../evil", typ: tar.TypeReg, body: "x"}},
		"absolute":        {{name: "/tmp/evil", typ: tar.TypeReg, body: "x"}},
		"through symlink": {{name: "a", typ: tar.TypeSymlink, link: ".."}, {name: "a/evil", typ: tar.TypeReg, body: "x"}},
		"through abs symlink": {
			{name: "a", typ: tar.TypeSymlink, link: "/"},
			{name: "a/tmp/evil", typ: tar.TypeReg, body: "x"},
		},
		"hardlink out":          {{name: "h", typ: tar.TypeLink, link: "../outside"}},
		"overwrite via symlink": {{name: "f", typ: tar.TypeSymlink, link: "../outside"}, {name: "f", typ: tar.TypeReg, body: "x"}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			outside := filepath.Join(parent, "outside")
			os.WriteFile(outside, []byte("keep"), 0o644)
			dst := filepath.Join(parent, "dst")
			os.Mkdir(dst, 0o755)
			Extract(archive(t, entries...), dst, Options{})
			if b, _ := os.ReadFile(outside); string(b) != "keep" {
				t.Fatalf("file outside the target was changed: %q", b)
			}
			for _, p := range []string{filepath.Join(parent, "evil"), "/tmp/evil"} {
				if _, err := os.Stat(p); err == nil {
					os.Remove(p)
					t.Fatalf("%s was written outside the target", p)
				}
			}
		})
	}
}

func TestExtractReportsEscape(t *testing.T) {
	_, err := Extract(archive(t, entry{name: "../x", typ: tar.TypeReg}), t.TempDir(), Options{})
	if err == nil || !strings.Contains(err.Error(), "escapes") {
		t.Fatalf("err = %v, want an escape refusal", err)
	}
}
