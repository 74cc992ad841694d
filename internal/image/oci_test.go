package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/smx-dev/smx/internal/errdefs"
)

// tarLayer builds an uncompressed layer from headers; a regular file's body
// is its Linkname field (cleared before writing), which keeps tables short.
func tarLayer(t *testing.T, hdrs ...tar.Header) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		body := ""
		if h.Typeflag == tar.TypeReg {
			body, h.Linkname = h.Linkname, ""
			h.Size = int64(len(body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func dir(n string) tar.Header { return tar.Header{Typeflag: tar.TypeDir, Name: n} }
func file(n, body string) tar.Header {
	return tar.Header{Typeflag: tar.TypeReg, Name: n, Linkname: body}
}
func symlink(n, target string) tar.Header {
	return tar.Header{Typeflag: tar.TypeSymlink, Name: n, Linkname: target}
}

// testImage is a two-layer linux/amd64 image. The second layer deletes
// etc/gone (whiteout) and empties opq/ (opaque whiteout), and both layers
// try to write outside the root through symlinks.
func testImage(t *testing.T) v1.Image {
	t.Helper()
	l1 := tarLayer(t,
		dir("etc/"),
		file("etc/keep", "kept\n"),
		file("etc/gone", "deleted by layer 2\n"),
		dir("opq/"),
		file("opq/old", "hidden by opaque dir\n"),
		dir("usr/"), dir("usr/lib/"),
		symlink("lib", "usr/lib"),
		file("lib/vialink", "through a relative symlink\n"),
		tar.Header{Typeflag: tar.TypeReg, Name: "bin/tool", Mode: 0o4755, Linkname: "#!/bin/sh\n"},
		tar.Header{Typeflag: tar.TypeLink, Name: "bin/tool2", Linkname: "bin/tool"},
		tar.Header{Typeflag: tar.TypeDir, Name: "home/u/", Mode: 0o750, Uid: 1000, Gid: 1000},
		tar.Header{Typeflag: tar.TypeReg, Name: "home/u/f", Uid: 1000, Gid: 1000, Linkname: "mine\n"},
		tar.Header{Typeflag: tar.TypeChar, Name: "dev/null", Devmajor: 1, Devminor: 3, Mode: 0o666},
		symlink("etc/mtab", "/proc/self/mounts"),
	)
	l2 := tarLayer(t,
		file("etc/.wh.gone", ""),
		file("opq/.wh..wh..opq", ""),
		file("opq/new", "new\n"),
		file("etc/new", "added\n"),
		// Writes through symlinks, one of them aiming above the root.
		symlink("alt", "/usr/lib"),
		file("alt/viaabs", "through an absolute symlink\n"),
		symlink("up", "/../../../.."),
		file("up/escaped", "must land in the image root\n"),
	)
	img, err := mutate.AppendLayers(empty.Image, l1, l2)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "FOO=bar"},
		WorkingDir: "/work",
		User:       "1000:1000",
		Entrypoint: []string{"/bin/tool"},
		Cmd:        []string{"--help"},
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestImport(t *testing.T) {
	requireBuildTools(t)
	img := testImage(t)
	src := t.TempDir()

	archive := filepath.Join(src, "img.tar")
	tag, err := name.NewTag("smx.test/img:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}

	layoutDir := filepath.Join(src, "layout")
	lp, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	// An arm64 image listed first must be passed over.
	other, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(other, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "arm64"})); err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		t.Fatal(err)
	}

	s := testStore(t)
	var digests []string
	for _, tc := range []struct {
		name, ref    string
		unprivileged bool
	}{
		{"from-archive", "docker-archive:" + archive, false},
		{"from-layout", "oci-layout:" + layoutDir, false},
		{"unprivileged", "oci-layout:" + layoutDir, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unprivileged = tc.unprivileged
			defer func() { unprivileged = false }()
			var progress bytes.Buffer
			im, err := s.Import(t.Context(), tc.name, tc.ref, &progress)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("progress:\n%s", progress.String())
			if !strings.Contains(progress.String(), "skipped 1 device nodes") {
				t.Errorf("progress does not report the skipped device node")
			}
			if im.Source != tc.ref {
				t.Errorf("Source = %q, want %q", im.Source, tc.ref)
			}
			want := &OCIConfig{Env: []string{"PATH=/usr/bin:/bin", "FOO=bar"}, WorkingDir: "/work", User: "1000:1000", Entrypoint: []string{"/bin/tool"}, Cmd: []string{"--help"}}
			if c := im.Config; c == nil || !slices.Equal(c.Env, want.Env) || c.WorkingDir != want.WorkingDir || c.User != want.User || !slices.Equal(c.Entrypoint, want.Entrypoint) || !slices.Equal(c.Cmd, want.Cmd) {
				t.Errorf("Config = %+v, want %+v", im.Config, want)
			}
			digests = append(digests, im.Digest)

			e := openExt4(t, im)
			for p, body := range map[string]string{
				"/etc/keep":  "kept\n",
				"/etc/new":   "added\n",
				"/opq/new":   "new\n",
				"/home/u/f":  "mine\n",
				"/bin/tool2": "#!/bin/sh\n",
			} {
				if got := e.cat(p); got != body {
					t.Errorf("cat %s = %q, want %q", p, got, body)
				}
			}
			// mutate.Extract drops entries below a symlink of an upper or
			// the same layer (the symlink hides them), so the attempts to
			// write through symlinks land nowhere; the extractor's own
			// symlink resolution (TestResolve) is a second fence.
			for _, p := range []string{"/etc/gone", "/opq/old", "/dev/null", "/usr/lib/vialink", "/lib/vialink", "/usr/lib/viaabs", "/escaped"} {
				if got := e.stat(p); got != "" {
					t.Errorf("%s exists (%s), want it gone", p, got)
				}
			}
			for p, want := range map[string]string{
				"/bin/tool": "104755 0 0",
				"/home/u":   "40750 1000 1000",
				"/home/u/f": "100644 1000 1000",
				"/lib":      "120777 0 0",
				"/alt":      "120777 0 0",
				"/proc":     "40555 0 0",
				"/sys":      "40555 0 0",
				"/dev":      "40755 0 0",
				"/run":      "40755 0 0",
				"/tmp":      "41777 0 0",
			} {
				if got := e.stat(p); got != want {
					t.Errorf("stat %s = %q, want %q", p, got, want)
				}
			}
			if got := e.debugfs("stat /bin/tool"); !strings.Contains(got, "Links: 2") {
				t.Errorf("/bin/tool is not hard-linked: %s", got)
			}
			if got := e.debugfs("stat /etc/keep"); !strings.Contains(got, "mtime: 0x6553f100") {
				t.Errorf("mtime not kept: %s", got)
			}
		})
	}
	if len(slices.Compact(slices.Clone(digests))) != 1 {
		t.Errorf("the same image imported three ways has several digests: %v", digests)
	}
	if _, err := os.Stat("/escaped"); err == nil {
		t.Errorf("/escaped was written on the host")
	}
}

func TestImportErrors(t *testing.T) {
	requireBuildTools(t)
	s := testStore(t)
	ctx := t.Context()
	src := t.TempDir()
	for _, tc := range []struct {
		ref  string
		want error
	}{
		{"docker.io/library/alpine", errdefs.ErrInvalid},
		{"docker-archive:", errdefs.ErrInvalid},
		{"docker-archive:" + filepath.Join(src, "missing.tar"), errdefs.ErrNotFound},
		{"oci-layout:" + src, errdefs.ErrInvalid},
	} {
		if _, err := s.Import(ctx, "x", tc.ref, nil); !errors.Is(err, tc.want) {
			t.Errorf("Import(%q) = %v, want %v", tc.ref, err, tc.want)
		}
	}

	// Two images in one archive: refuse rather than guess.
	a, _ := random.Image(256, 1)
	b, _ := random.Image(256, 1)
	ta, _ := name.NewTag("smx.test/a:1")
	tb, _ := name.NewTag("smx.test/b:1")
	multi := filepath.Join(src, "multi.tar")
	if err := tarball.MultiRefWriteToFile(multi, map[name.Reference]v1.Image{ta: a, tb: b}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, "x", "docker-archive:"+multi, nil); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "holds 2 images") {
		t.Errorf("multi-image archive: %v", err)
	}

	// Wrong architecture.
	cf, _ := a.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "arm64"
	arm, _ := mutate.ConfigFile(a, cf)
	armTar := filepath.Join(src, "arm.tar")
	if err := tarball.WriteToFile(armTar, ta, arm); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, "x", "docker-archive:"+armTar, nil); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "linux/arm64") {
		t.Errorf("arm64 archive: %v", err)
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Errorf("failed imports left images: %+v", list)
	}
	assertNoTemp(t, s)
}

func TestResolve(t *testing.T) {
	tr, err := newTree(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(tr.mkdir("usr/lib", 0o755, 0, 0))
	must(tr.symlink("usr/lib", "lib", 0, 0))
	must(tr.symlink("/usr", "abs", 0, 0))
	must(tr.symlink("../../..", "usr/up", 0, 0))
	must(tr.symlink("loop", "loop", 0, 0))
	must(tr.writeString("file", "x", 0o644))
	for in, want := range map[string]string{
		".":          ".",
		"lib":        "usr/lib",
		"lib/x/y":    "usr/lib/x/y",
		"abs/lib":    "usr/lib",
		"usr/up":     ".",
		"usr/up/etc": "etc",
		"../../a":    "a",
		"new/..":     ".",
		"abs/../abs": "usr",
	} {
		got, err := tr.resolve(in)
		if err != nil || got != want {
			t.Errorf("resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"loop", "file/x"} {
		if got, err := tr.resolve(in); err == nil {
			t.Errorf("resolve(%q) = %q, want error", in, got)
		}
	}
}

// TestExtractorFences feeds the extractor a hostile stream directly (not
// through mutate.Extract, which would already drop most of it).
func TestExtractorFences(t *testing.T) {
	base := t.TempDir()
	rootDir := filepath.Join(base, "root")
	tr, err := newTree(rootDir, os.Geteuid() == 0)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []tar.Header{
		{Typeflag: tar.TypeReg, Name: "../../outside1", Mode: 0o644},
		{Typeflag: tar.TypeSymlink, Name: "up", Linkname: "/../../.."},
		{Typeflag: tar.TypeReg, Name: "up/outside2", Mode: 0o644},
		{Typeflag: tar.TypeSymlink, Name: "rel", Linkname: "../../.."},
		{Typeflag: tar.TypeReg, Name: "rel/outside3", Mode: 0o644},
		{Typeflag: tar.TypeLink, Name: "hl", Linkname: "../../../etc/passwd"},
		{Typeflag: tar.TypeLink, Name: "hl2", Linkname: "up/outside2"},
	} {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	x := extractor{t: tr}
	if err := x.run(&buf); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"outside1", "outside2", "outside3", "hl2"} {
		if _, err := os.Lstat(filepath.Join(rootDir, p)); err != nil {
			t.Errorf("%s not inside the root: %v", p, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(rootDir, "hl")); err == nil {
		t.Errorf("hard link to a missing file was made")
	}
	ents, _ := os.ReadDir(base)
	if len(ents) != 1 {
		t.Errorf("extractor wrote next to the root: %v", ents)
	}
}

func TestImportCancelled(t *testing.T) {
	requireBuildTools(t)
	archive := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("smx.test/img:1")
	if err := tarball.WriteToFile(archive, tag, testImage(t)); err != nil {
		t.Fatal(err)
	}
	s := testStore(t)
	for _, step := range []string{"extracting", "mkfs.ext4"} {
		ctx, cancel := context.WithCancel(t.Context())
		_, err := s.Import(ctx, "x", "docker-archive:"+archive, &cancelOn{step: step, cancel: cancel})
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancel at %q: err = %v, want context.Canceled", step, err)
		}
		if list, _ := s.List(); len(list) != 0 {
			t.Errorf("cancel at %q: List = %+v", step, list)
		}
		assertNoTemp(t, s)
	}
}
