package shim

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/testutil"
)

// writeRootTree makes a small root file system whose file "bin/app" holds
// content, with fixed modes and times, so that two trees differ only in
// that file's bytes.
func writeRootTree(t testing.TB, dir, content string) {
	t.Helper()
	when := time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC)
	files := map[string]string{"bin/app": content, "etc-motd": "hello\n"}
	testutil.WriteTree(t, dir, files)
	for name := range files {
		p := filepath.Join(dir, name)
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, when, when); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("bin/app", filepath.Join(dir, "app")); err != nil {
		t.Fatal(err)
	}
}

// TestTreeKeyContent: two roots with equal names, modes, owners, sizes
// and times but different bytes (a pod author's copy of a public image
// with one binary swapped for one of the same length) get different
// keys, so the second never boots the first's import; the same content
// in another directory (another snapshot of the same image) gets the same
// key; another containerd namespace gets another key.
func TestTreeKeyContent(t *testing.T) {
	ctx := context.Background()
	base := t.TempDir()
	public, crafted, again := filepath.Join(base, "public"), filepath.Join(base, "crafted"), filepath.Join(base, "again")
	writeRootTree(t, public, "#!/bin/sh\necho genuine\n")
	writeRootTree(t, crafted, "#!/bin/sh\necho ATTACK!\n") // same length
	writeRootTree(t, again, "#!/bin/sh\necho genuine\n")

	key := func(ns, dir string) string {
		k, err := treeKey(ctx, ns, dir)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if a, b := key("default", public), key("default", crafted); a == b {
		t.Fatalf("equal metadata, different bytes: same key %s", a)
	}
	if a, b := key("default", public), key("default", again); a != b {
		t.Fatalf("same content in another directory: keys %s and %s differ", a, b)
	}
	if a, b := key("default", public), key("k8s.io", public); a == b {
		t.Fatalf("two namespaces share key %s", a)
	}
}

// BenchmarkTreeKey measures the content hash on a tree named by
// SMX_BENCH_ROOTFS (an unpacked image), else on the Go toolchain's
// source tree.
func BenchmarkTreeKey(b *testing.B) {
	dir := os.Getenv("SMX_BENCH_ROOTFS")
	if dir == "" {
		out, err := exec.Command("go", "env", "GOROOT").Output()
		if err != nil {
			b.Skip("no tree: set SMX_BENCH_ROOTFS")
		}
		dir = filepath.Join(strings.TrimSpace(string(out)), "src")
	}
	var size int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			size += fi.Size()
		}
		return nil
	})
	b.SetBytes(size)
	for b.Loop() {
		if _, err := treeKey(context.Background(), "default", dir); err != nil {
			b.Fatal(err)
		}
	}
}
