package image

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
)

// TestImportDir imports an unpacked root filesystem (what the containerd
// shim does with a bundle's rootfs): the same tree gives the same digest,
// a changed file another, symlinks (also absolute ones) are kept as
// links rather than followed, and a missing directory is NotFound.
func TestImportDir(t *testing.T) {
	requireTools(t, "mkfs.ext4", "qemu-img", "debugfs")
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "bin"), 0o755))
	must(os.WriteFile(filepath.Join(src, "bin", "tool"), []byte("#!/bin/sh\necho tool\n"), 0o755))
	must(os.Symlink("tool", filepath.Join(src, "bin", "sh")))
	must(os.Symlink("/etc", filepath.Join(src, "hostetc")))
	s := &Store{Dir: t.TempDir()}
	ctx := context.Background()
	a, err := s.Import(ctx, "a", "dir:"+src, nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(t.TempDir(), "a.raw")
	if out, err := exec.Command("qemu-img", "convert", "-O", "raw", a.Path, raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v\n%s", err, out)
	}
	out, err := exec.Command("debugfs", "-R", "stat /hostetc", raw).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Type: symlink") || !strings.Contains(string(out), `Fast link dest: "/etc"`) {
		t.Fatalf("/hostetc is not the symlink to /etc it was: %v\n%s", err, out)
	}
	b, err := s.Import(ctx, "b", "dir:"+src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != b.Digest {
		t.Fatalf("same tree, digests %s and %s", a.Digest, b.Digest)
	}
	must(os.WriteFile(filepath.Join(src, "bin", "tool"), []byte("#!/bin/sh\necho other\n"), 0o755))
	c, err := s.Import(ctx, "c", "dir:"+src, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Digest == a.Digest {
		t.Fatal("a changed file kept the digest")
	}
	if _, err := s.Import(ctx, "d", "dir:"+filepath.Join(src, "nope"), nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing directory: %v, want NotFound", err)
	}
}
