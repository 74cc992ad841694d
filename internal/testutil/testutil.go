// Package testutil gates tests on host capabilities, loudly: outside CI a
// missing capability skips with how to fix it; under CI=true it fails,
// because a CI run that silently skips its VM tests proves nothing.
package testutil

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// InCI reports whether tests run under CI=true.
func InCI() bool { return os.Getenv("CI") == "true" }

// Require skips (or, under CI, fails) the test when ok is false.
func Require(t testing.TB, ok bool, what, fix string) {
	t.Helper()
	if ok {
		return
	}
	if InCI() {
		t.Fatalf("%s is required under CI=true: %s", what, fix)
	}
	t.Skipf("%s not available: %s", what, fix)
}

// RequireQEMU needs qemu-system-x86_64 (or $SMX_QEMU) and qemu-img.
func RequireQEMU(t testing.TB) {
	t.Helper()
	QEMU(t)
}

// QEMU needs qemu-system-x86_64 (or $SMX_QEMU) and qemu-img and returns
// the path of the QEMU binary.
func QEMU(t testing.TB) string {
	t.Helper()
	q := os.Getenv("SMX_QEMU")
	if q == "" {
		q = "qemu-system-x86_64"
	}
	p, err1 := exec.LookPath(q)
	_, err2 := exec.LookPath("qemu-img")
	Require(t, err1 == nil && err2 == nil, "QEMU", "apt-get install qemu-system-x86 qemu-utils (or run scripts/test.sh)")
	return p
}

// KernelCache is the directory of cached guest kernels that VM tests link
// into their own state directories ($SMX_TEST_KERNELS, set by
// scripts/test.sh after `smx setup`).
func KernelCache(t testing.TB) string {
	t.Helper()
	d := os.Getenv("SMX_TEST_KERNELS")
	if d == "" {
		d = os.Getenv("SMX_TEST_KERNEL_CACHE")
	}
	if d == "" {
		d = "/var/lib/smx/kernels"
	}
	ents, _ := os.ReadDir(d)
	Require(t, len(ents) > 0, "guest kernel cache "+d, "run `smx setup` (or scripts/test.sh) first")
	return d
}

// DebianImage links the Debian test image (git, curl, openssh-client,
// rsync; built once by scripts/test.sh into $SMX_TEST_IMAGES as
// $SMX_TEST_DEBIAN_IMAGE) into the state directory home and returns its
// name. Tests must not remove it: the link is all they own.
func DebianImage(t testing.TB, home string) string {
	t.Helper()
	name, dir := os.Getenv("SMX_TEST_DEBIAN_IMAGE"), os.Getenv("SMX_TEST_IMAGES")
	_, err := os.Stat(filepath.Join(dir, name, "image.json"))
	Require(t, name != "" && dir != "" && err == nil, "Debian test image", "run scripts/test.sh, which builds it once (SMX_TEST_IMAGES, SMX_TEST_DEBIAN_IMAGE)")
	link := filepath.Join(home, "images", name)
	if _, err := os.Lstat(link); err == nil {
		return name
	}
	if err := os.MkdirAll(filepath.Join(home, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, name), link); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	return name
}

// RepoRoot is the module root.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// Binaries returns a directory holding smx and smx-agent: $SMX_BIN when
// set (scripts/test.sh builds them once), otherwise built now, once per
// test binary.
func Binaries(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("SMX_BIN"); d != "" {
		return d
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "smx-bin-")
		if buildErr != nil {
			return
		}
		root := RepoRoot()
		for _, b := range []struct {
			out, pkg string
			static   bool
		}{
			{"smx", "./cmd/smx", false},
			{"smx-agent", "./cmd/smx-agent", true},
			{"containerd-shim-smx-v1", "./cmd/containerd-shim-smx-v1", false},
		} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(buildDir, b.out), b.pkg)
			cmd.Dir = root
			cmd.Env = os.Environ()
			if b.static {
				cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = errors.Join(buildErr, fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out))
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}
