package image

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

// requireTools skips when a host tool is missing, except under CI=true,
// where a missing tool is a broken CI image and must fail loudly.
func requireTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		p := n
		if !strings.HasPrefix(n, "/") {
			var err error
			if p, err = exec.LookPath(n); err != nil {
				p = ""
			}
		} else if _, err := os.Stat(n); err != nil {
			p = ""
		}
		if p == "" {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s not found (CI=true): install e2fsprogs qemu-utils busybox-static", n)
			}
			t.Skipf("%s not found: install e2fsprogs qemu-utils busybox-static to run this test", n)
		}
	}
}

func requireBuildTools(t *testing.T) {
	requireTools(t, "mkfs.ext4", "qemu-img", "debugfs", busyboxPath)
}

// ext4 gives read access to an image's filesystem through debugfs on a raw
// copy of its disk.
type ext4 struct {
	t   *testing.T
	raw string
}

func openExt4(t *testing.T, im *Image) *ext4 {
	t.Helper()
	raw := filepath.Join(t.TempDir(), "raw.img")
	if out, err := exec.Command("qemu-img", "convert", "-O", "raw", im.Path, raw).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v: %s", err, out)
	}
	return &ext4{t: t, raw: raw}
}

func (e *ext4) debugfs(cmd string) string {
	e.t.Helper()
	var stdout, stderr bytes.Buffer
	c := exec.Command("debugfs", "-R", cmd, e.raw)
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Run(); err != nil {
		e.t.Fatalf("debugfs -R %q: %v: %s", cmd, err, stderr.String())
	}
	return stdout.String()
}

func (e *ext4) cat(p string) string { return e.debugfs("cat " + p) }

// stat returns "mode uid gid" of p, e.g. "40755 1000 1000", or "" when p
// does not exist.
func (e *ext4) stat(p string) string {
	dir, base := filepath.Split(p)
	for _, l := range strings.Split(e.debugfs("ls -l "+dir), "\n") {
		f := strings.Fields(l)
		// inode mode (links) uid gid size date time name...
		if len(f) >= 9 && strings.Join(f[8:], " ") == base {
			return f[1] + " " + f[3] + " " + f[4]
		}
	}
	return ""
}

func testStore(t *testing.T) *Store {
	return &Store{Dir: filepath.Join(t.TempDir(), "images")}
}

func TestValidName(t *testing.T) {
	for _, n := range []string{"a", "busybox", "deb-12.1_x", "0", strings.Repeat("a", 63)} {
		if err := ValidName(n); err != nil {
			t.Errorf("ValidName(%q) = %v, want nil", n, err)
		}
	}
	for _, n := range []string{"", ".tmp-x", "-a", "_a", "A", "a/b", "..", "a b", strings.Repeat("a", 64), "é"} {
		if err := ValidName(n); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ValidName(%q) = %v, want ErrInvalid", n, err)
		}
	}
}

func TestBusyboxLifecycle(t *testing.T) {
	requireBuildTools(t)
	ctx := t.Context()
	s := testStore(t)

	if _, err := s.Get("bb"); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "smx image build bb --from busybox") {
		t.Fatalf("Get before build = %v, want ErrNotFound with a hint", err)
	}
	var progress bytes.Buffer
	start := time.Now()
	im, err := s.BuildBusybox(ctx, "bb", &progress)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("busybox build took %v; progress:\n%s", time.Since(start), progress.String())
	for _, want := range []string{"image: building busybox root", "image: mkfs.ext4 (", "image: converting to qcow2", "image: done: bb sha256:"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	if im.Name != "bb" || im.Source != "busybox" || !strings.HasPrefix(im.Digest, "sha256:") || im.Size < 64<<20 || im.DiskBytes <= 0 {
		t.Errorf("image = %+v", im)
	}
	if im.Path != filepath.Join(s.Dir, "bb", "disk.qcow2") {
		t.Errorf("Path = %s", im.Path)
	}

	e := openExt4(t, im)
	for p, want := range map[string]string{
		"/bin/busybox": "100755 0 0",
		"/home/user":   "40755 1000 1000",
		"/tmp":         "41777 0 0",
		"/root":        "40700 0 0",
		"/proc":        "40755 0 0",
		"/etc/passwd":  "100644 0 0",
		"/bin/sh":      "120777 0 0",
	} {
		if got := e.stat(p); got != want {
			t.Errorf("stat %s = %q, want %q", p, got, want)
		}
	}
	for _, p := range []string{"/sys", "/dev", "/run", "/etc/ssl/certs", "/usr/bin/env"} {
		if e.stat(p) == "" {
			t.Errorf("%s missing", p)
		}
	}
	if got := e.cat("/etc/passwd"); !strings.Contains(got, "user:x:1000:1000:user:/home/user:/bin/sh") || !strings.HasPrefix(got, "root:x:0:0:root:/root:/bin/sh") {
		t.Errorf("/etc/passwd = %q", got)
	}
	if got := e.debugfs("stats"); !strings.Contains(got, "Filesystem volume name:   smx-root") {
		t.Errorf("volume label missing: %s", got)
	}

	// Same content, same digest: the digest ignores mkfs's randomness and
	// timestamps.
	im2, err := s.BuildBusybox(ctx, "bb2", nil)
	if err != nil {
		t.Fatal(err)
	}
	if im2.Digest != im.Digest {
		t.Errorf("digests differ between identical builds: %s %s", im.Digest, im2.Digest)
	}

	if _, err := s.BuildBusybox(ctx, "bb", nil); !errors.Is(err, errdefs.ErrExists) || !strings.Contains(err.Error(), "smx image rm bb") {
		t.Errorf("rebuild = %v, want ErrExists", err)
	}
	if _, err := s.BuildBusybox(ctx, "Bad/Name", nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bad name = %v, want ErrInvalid", err)
	}

	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "bb" || list[1].Name != "bb2" {
		t.Fatalf("List = %+v", list)
	}
	got, err := s.Get("bb")
	if err != nil || got.Digest != im.Digest || got.Size != im.Size {
		t.Fatalf("Get = %+v, %v", got, err)
	}

	// Overlay: the lead's sandboxes use these.
	ov := filepath.Join(t.TempDir(), "ov.qcow2")
	if err := im.CreateOverlay(ctx, ov, im.Size-1); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("small overlay = %v, want ErrInvalid", err)
	}
	if err := im.CreateOverlay(ctx, ov, 1<<30); err != nil {
		t.Fatal(err)
	}
	info, err := exec.Command("qemu-img", "info", "--output=json", ov).Output()
	if err != nil || !strings.Contains(string(info), `"virtual-size": 1073741824`) || !strings.Contains(string(info), im.Path) {
		t.Errorf("overlay info = %s, %v", info, err)
	}

	inUse := func(name string) (bool, error) { return name == "bb", nil }
	if err := s.Remove("bb", inUse); !errors.Is(err, errdefs.ErrInUse) {
		t.Errorf("Remove in use = %v, want ErrInUse", err)
	}
	if err := s.Remove("bb2", inUse); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove("bb2", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Remove twice = %v, want ErrNotFound", err)
	}
	if err := s.Remove("bb", nil); err != nil {
		t.Fatal(err)
	}
	if list, err := s.List(); err != nil || len(list) != 0 {
		t.Errorf("List after remove = %+v, %v", list, err)
	}
	assertNoTemp(t, s)
}

func assertNoTemp(t *testing.T, s *Store) {
	t.Helper()
	ents, _ := os.ReadDir(s.Dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			t.Errorf("leftover %s in store", e.Name())
		}
	}
}

// TestBusyboxUnprivileged runs the non-root path (owners set with debugfs)
// even when the test runs as root.
func TestBusyboxUnprivileged(t *testing.T) {
	requireBuildTools(t)
	unprivileged = true
	t.Cleanup(func() { unprivileged = false })
	s := testStore(t)
	im, err := s.BuildBusybox(t.Context(), "bb", nil)
	if err != nil {
		t.Fatal(err)
	}
	e := openExt4(t, im)
	for p, want := range map[string]string{
		"/bin/busybox": "100755 0 0",
		"/home/user":   "40755 1000 1000",
		"/tmp":         "41777 0 0",
		"/root":        "40700 0 0",
	} {
		if got := e.stat(p); got != want {
			t.Errorf("stat %s = %q, want %q", p, got, want)
		}
	}
}

// cancelOn is a progress writer that cancels a build when it reports a step,
// so that every step is interrupted deterministically.
type cancelOn struct {
	step   string
	cancel context.CancelFunc
}

func (c *cancelOn) Write(p []byte) (int, error) {
	if strings.Contains(string(p), c.step) {
		c.cancel()
	}
	return len(p), nil
}

func TestBuildCancelled(t *testing.T) {
	requireBuildTools(t)
	s := testStore(t)
	for _, step := range []string{"", "building busybox root", "mkfs.ext4", "converting to qcow2", "done:"} {
		ctx, cancel := context.WithCancel(t.Context())
		if step == "" {
			cancel()
		}
		_, err := s.BuildBusybox(ctx, "bb", &cancelOn{step: step, cancel: cancel})
		cancel()
		if step == "done:" {
			// Cancelling after publishing is too late: the image is whole.
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Remove("bb", nil); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancel at %q: err = %v, want context.Canceled", step, err)
		}
		if list, err := s.List(); err != nil || len(list) != 0 {
			t.Errorf("cancel at %q: List = %+v, %v", step, list, err)
		}
		assertNoTemp(t, s)
	}
}

func TestStaleTempCleaned(t *testing.T) {
	s := testStore(t)
	stale := filepath.Join(s.Dir, ".tmp-x-123")
	if err := os.MkdirAll(filepath.Join(stale, "root"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A directory without image.json is a half-written image from an older
	// layout or a manual copy: never shown.
	if err := os.MkdirAll(filepath.Join(s.Dir, "half"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A live build holds its lock: List must leave it alone.
	b, err := s.begin("live", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.abort()
	list, err := s.List()
	if err != nil || len(list) != 0 {
		t.Fatalf("List = %+v, %v", list, err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale dir survived List: %v", err)
	}
	if _, err := os.Stat(b.dir); err != nil {
		t.Errorf("live build dir removed: %v", err)
	}
	if _, err := s.Get("half"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Get half = %v, want ErrNotFound", err)
	}
}

// TestConcurrentBuilds checks that two builds of one name never both win.
func TestConcurrentBuilds(t *testing.T) {
	requireBuildTools(t)
	s := testStore(t)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { _, errs[i] = s.BuildBusybox(t.Context(), "same", nil) })
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, errdefs.ErrExists):
			t.Errorf("unexpected error %v", err)
		}
	}
	if ok != 1 {
		t.Errorf("%d builds succeeded, want 1: %v", ok, errs)
	}
	assertNoTemp(t, s)
	if _, err := s.Get("same"); err != nil {
		t.Error(err)
	}
}
