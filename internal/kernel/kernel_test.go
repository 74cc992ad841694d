package kernel

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
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
	if f, err := FindStock(cache); err != nil || f.Version != k.Version {
		t.Fatalf("Find = %+v, %v", f, err)
	}
}

func TestFindPrefersOwn(t *testing.T) {
	cache := t.TempDir()
	fakeKernel(t, cache, "6.1.0-99-amd64", true)
	fakeKernel(t, cache, "6.0.1-smx-0badc0de", true)
	if k, _ := Find(cache); k.Version != "6.1.0-99-amd64" || k.Own {
		t.Fatalf("without a build marker: Find = %+v", k)
	}
	os.WriteFile(filepath.Join(cache, "6.0.1-smx-0badc0de", ownMarker), []byte("{}"), 0o644)
	fakeKernel(t, cache, "7.0.0-1-amd64", true) // a newer stock kernel
	k, err := Find(cache)
	if err != nil || k.Version != "6.0.1-smx-0badc0de" || !k.Own {
		t.Fatalf("Find = %+v, %v", k, err)
	}
	if s, err := FindStock(cache); err != nil || s.Version != "7.0.0-1-amd64" || s.Own {
		t.Fatalf("FindStock = %+v, %v", s, err)
	}
	ks, _ := List(cache)
	var got []string
	for _, k := range ks {
		got = append(got, k.Version)
	}
	if strings.Join(got, " ") != "6.0.1-smx-0badc0de 7.0.0-1-amd64 6.1.0-99-amd64" {
		t.Fatalf("List order = %v", got)
	}
}

func TestOwnVersion(t *testing.T) {
	v := OwnVersion("6.1.172-1")
	if !strings.HasPrefix(v, "6.1.172-smx-") || len(v) != len("6.1.172-smx-")+8 || !IsOwn(v) {
		t.Fatalf("OwnVersion = %q", v)
	}
	if OwnVersion("6.1.172-2") == v {
		t.Fatal("a new package revision must be a new kernel")
	}
	if IsOwn("6.1.0-48-amd64") {
		t.Fatal("IsOwn(stock)")
	}
}

// checkConfig catches an option Kconfig dropped for a missing dependency.
func TestCheckConfig(t *testing.T) {
	dot := filepath.Join(t.TempDir(), ".config")
	os.WriteFile(dot, []byte("CONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=\"x\"\n"), 0o644)
	if err := checkConfig([]byte("# comment\nCONFIG_A=y\n# CONFIG_B is not set\nCONFIG_C=\"x\"\n"), dot); err != nil {
		t.Fatal(err)
	}
	err := checkConfig([]byte("CONFIG_A=y\nCONFIG_D=y\nCONFIG_B=y\n"), dot)
	if err == nil || !strings.Contains(err.Error(), "CONFIG_D=y (got n)") || !strings.Contains(err.Error(), "CONFIG_B=y (got n)") {
		t.Fatalf("err = %v", err)
	}
	// The fragment in the repo parses, and says no modules.
	if m := parseConfig(Config); m["CONFIG_MODULES"] != "n" || m["CONFIG_VIRTIO_MMIO"] != "y" || len(m) < 50 {
		t.Fatalf("Config parses to %d options: %v", len(m), m)
	}
}

// TestBuild checks the own kernel that `smx kernel build` (scripts/test.sh)
// left in SMX_TEST_KERNEL_CACHE: Build finds it without building, and it is
// what the configuration in this package asks for.
func TestBuild(t *testing.T) {
	cache := os.Getenv("SMX_TEST_KERNEL_CACHE")
	if cache == "" {
		t.Skip("set SMX_TEST_KERNEL_CACHE to a kernel cache holding smx's own kernel (`smx kernel build`)")
	}
	ctx := context.Background()
	sv, err := sourceVersion(ctx)
	if err != nil {
		t.Skip(err)
	}
	if _, err := Load(cache, OwnVersion(sv)); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("smx's own kernel is not built in %s under CI=true: %v", cache, err)
		}
		t.Skipf("own kernel not built (`smx kernel build`): %v", err)
	}
	start := time.Now()
	k, err := Build(ctx, cache, BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cached Build took %v", time.Since(start))
	if !k.Own || k.Vmlinux == "" || !isELF(k.Vmlinux) || k.Version != OwnVersion(sv) {
		t.Fatalf("Build = %+v", k)
	}
	if err := checkConfig(Config, filepath.Join(k.Dir, "config")); err != nil {
		t.Fatal(err)
	}
	info, err := ReadBuildInfo(k)
	if err != nil || info.SourceVersion != sv || info.Version != k.Version {
		t.Fatalf("build info %+v, %v", info, err)
	}
	t.Logf("%s: built from %s %s in %.0f s with %d jobs", k.Version, info.SourcePackage, info.SourceVersion, info.BuildSeconds, info.Jobs)
	// The kernel reports the version it is cached under (the guest's uname -r).
	img, _ := os.ReadFile(k.Vmlinux)
	if !bytes.Contains(img, []byte("Linux version "+k.Version+" ")) {
		t.Errorf("vmlinux does not say Linux version %s", k.Version)
	}
}
