package kernel

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"smx/internal/errdefs"
)

func TestCompareVersions(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int // sign
	}{
		{"6.1.0-10-amd64", "6.1.0-9-amd64", 1},
		{"6.1.0-57-amd64", "6.1.0-57-amd64", 0},
		{"6.1.0-57-amd64", "6.12.0-1-amd64", -1},
		{"6.1.0-057-amd64", "6.1.0-57-amd64", 0},
		{"6.1.0-57", "6.1.0-57-amd64", -1},
	} {
		got := compareVersions(tc.a, tc.b)
		if (got > 0) != (tc.want > 0) || (got < 0) != (tc.want < 0) {
			t.Errorf("compareVersions(%q, %q) = %d, want sign %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func fakeKernel(t *testing.T, cache, version string, complete bool) {
	t.Helper()
	mods := filepath.Join(cache, version, "lib", "modules", version)
	if err := os.MkdirAll(mods, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(cache, version, "vmlinuz"), []byte("k"), 0o644)
	if complete {
		os.WriteFile(filepath.Join(mods, "modules.dep"), nil, 0o644)
	}
}

func TestFind(t *testing.T) {
	cache := t.TempDir()
	if _, err := Find(cache); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("empty cache: err = %v", err)
	}
	if _, err := Find(filepath.Join(cache, "missing")); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing cache: err = %v", err)
	}
	fakeKernel(t, cache, "6.1.0-9-amd64", true)
	fakeKernel(t, cache, "6.1.0-10-amd64", true)
	fakeKernel(t, cache, "6.1.0-11-amd64", false) // no modules.dep: not usable
	os.MkdirAll(filepath.Join(cache, tmpPrefix+"123"), 0o755)
	k, err := Find(cache)
	if err != nil {
		t.Fatal(err)
	}
	if k.Version != "6.1.0-10-amd64" || k.Vmlinuz != filepath.Join(cache, "6.1.0-10-amd64", "vmlinuz") ||
		k.ModulesDir != filepath.Join(cache, "6.1.0-10-amd64", "lib", "modules", "6.1.0-10-amd64") {
		t.Fatalf("Find = %+v", k)
	}
}

// TestEnsure fetches the real kernel package into SMX_TEST_KERNEL_CACHE
// (about 100 MB download on first run, instant afterwards).
func TestEnsure(t *testing.T) {
	cache := os.Getenv("SMX_TEST_KERNEL_CACHE")
	if cache == "" {
		t.Skip("set SMX_TEST_KERNEL_CACHE to a directory to test fetching the kernel")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	k, err := Ensure(ctx, cache, &progress)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(k.ModulesDir, "modules.dep")); err != nil {
		t.Fatal(err)
	}
	if k.Vmlinux == "" || k.BootImage() != k.Vmlinux {
		t.Errorf("no vmlinux extracted (is xz installed?): %+v", k)
	}
	start := time.Now()
	k2, err := Ensure(ctx, cache, nil)
	if err != nil || *k2 != *k {
		t.Fatalf("second Ensure = %+v, %v", k2, err)
	}
	t.Logf("cached Ensure took %v", time.Since(start))
	if f, err := Find(cache); err != nil || f.Version != k.Version {
		t.Fatalf("Find = %+v, %v", f, err)
	}
}
