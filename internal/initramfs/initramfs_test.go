package initramfs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/testutil"
)

const syntheticDep = `kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/virtio/virtio.ko:
kernel/drivers/virtio/virtio_ring.ko:
kernel/drivers/net/virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/drivers/net/net_failover.ko: kernel/net/core/failover.ko
kernel/net/core/failover.ko:
kernel/drivers/char/hw_random/virtio-rng.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko
kernel/fs/a.ko: kernel/fs/b.ko
kernel/fs/b.ko: kernel/fs/a.ko
kernel/fs/c.ko: kernel/fs/missing.ko
`

func TestLoadOrder(t *testing.T) {
	deps, byName, err := parseDep([]byte(syntheticDep))
	if err != nil {
		t.Fatal(err)
	}
	if byName["virtio_rng"] != "kernel/drivers/char/hw_random/virtio-rng.ko" {
		t.Fatalf("name of virtio-rng.ko: %v", byName)
	}
	got, err := loadOrder(deps, []string{byName["virtio_net"], byName["virtio_mmio"], byName["virtio_rng"]})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"kernel/drivers/virtio/virtio_ring.ko",
		"kernel/drivers/virtio/virtio.ko",
		"kernel/net/core/failover.ko",
		"kernel/drivers/net/net_failover.ko",
		"kernel/drivers/net/virtio_net.ko",
		"kernel/drivers/virtio/virtio_mmio.ko",
		"kernel/drivers/char/hw_random/virtio-rng.ko",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("order:\n got %q\nwant %q", got, want)
	}
	if _, err := loadOrder(deps, []string{"kernel/fs/a.ko"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("cycle: err = %v", err)
	}
	if _, err := loadOrder(deps, []string{"kernel/fs/c.ko"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing dep: err = %v", err)
	}
}

func TestResolveBuiltinAndMissing(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(syntheticDep), 0o644)
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/fs/ext4/ext4.ko\n"), 0o644)
	got, err := resolve(dir, []string{"ext4", "virtio_mmio", "vsock"}, []string{"vsock"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[2] != "kernel/drivers/virtio/virtio_mmio.ko" {
		t.Fatalf("resolve = %q", got)
	}
	if _, err := resolve(dir, []string{"overlay"}, nil); !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "overlay") {
		t.Fatalf("missing module: err = %v", err)
	}
}

type entry struct {
	name  string
	mode  uint32
	rdev  [2]uint32
	data  []byte
	index int
}

// readNewc parses a newc archive, checking the format as strictly as the
// kernel does.
func readNewc(t *testing.T, b []byte) []entry {
	t.Helper()
	var out []entry
	off := 0
	for {
		if off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d", off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return uint32(v)
		}
		mode, size, namesize := field(1), int(field(6)), int(field(11))
		rdev := [2]uint32{field(9), field(10)}
		name := string(b[off+110 : off+110+namesize-1])
		off += (110 + namesize + 3) &^ 3
		if name == "TRAILER!!!" {
			return out
		}
		out = append(out, entry{name: name, mode: mode, rdev: rdev, data: b[off : off+size], index: len(out)})
		off += (size + 3) &^ 3
	}
}

func TestBuildRealKernel(t *testing.T) {
	cache := os.Getenv("SMX_TEST_KERNEL_CACHE")
	if cache == "" {
		t.Skip("set SMX_TEST_KERNEL_CACHE to a kernel cache (filled by `smx setup` or the kernel package's TestEnsure)")
	}
	// The distribution kernel's path (modules resolved from modules.dep),
	// whatever else is cached: smx's own kernel has no modules.
	k, err := kernel.FindStock(cache)
	if err != nil {
		t.Fatal(err)
	}
	agent := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(agent, []byte("#!/bin/sh\necho fake agent\n"), 0o600)
	out := t.TempDir()
	ctx := context.Background()

	start := time.Now()
	p, err := Build(ctx, k, agent, out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first build %v", time.Since(start))
	fi, _ := os.Stat(p)
	t.Logf("%s: %d bytes", p, fi.Size())

	start = time.Now()
	p2, err := Build(ctx, k, agent, out)
	if err != nil || p2 != p {
		t.Fatalf("second build = %s, %v", p2, err)
	}
	t.Logf("cached build %v", time.Since(start))
	if tmps, _ := filepath.Glob(filepath.Join(out, ".initramfs-*")); len(tmps) != 0 {
		t.Fatalf("temporary files left: %v", tmps)
	}

	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	entries := readNewc(t, b)
	byName := map[string]entry{}
	for _, e := range entries {
		if _, dup := byName[e.name]; dup {
			t.Fatalf("duplicate entry %s", e.name)
		}
		byName[e.name] = e
	}
	// Every parent directory is an explicit 0755 record before its children.
	for _, e := range entries {
		for d := filepath.Dir(e.name); d != "."; d = filepath.Dir(d) {
			de, ok := byName[d]
			if !ok || de.mode != modeDir|0o755 || de.index > e.index {
				t.Fatalf("%s: parent %s missing, not 0755 or after it: %+v", e.name, d, de)
			}
		}
	}
	if e := byName["init"]; e.mode != modeFile|0o755 || !bytes.Equal(e.data, []byte("#!/bin/sh\necho fake agent\n")) {
		t.Fatalf("init = %o %q", e.mode, e.data)
	}
	if e := byName["dev/console"]; e.mode != modeChar|0o600 || e.rdev != [2]uint32{5, 1} {
		t.Fatalf("dev/console = %+v", e)
	}

	list := strings.Fields(string(byName["etc/smx/modules"].data))
	pos := map[string]int{}
	for i, m := range list {
		pos[moduleName(m)] = i
		e, ok := byName[strings.TrimPrefix(m, "/")]
		if !ok || len(e.data) == 0 || e.mode != modeFile|0o644 {
			t.Fatalf("listed module %s not in archive", m)
		}
		if !strings.HasPrefix(m, "/lib/modules/"+k.Version+"/") {
			t.Fatalf("module path %s", m)
		}
	}
	t.Logf("load order: %s", strings.Join(list, " "))
	// Every module loads after everything this kernel's modules.dep says it
	// needs. The order between two modules is asserted only where the
	// kernel requires it: builds differ (in 6.1.0-48 virtio does not depend
	// on virtio_ring, in 6.1.0-57 it does), and a fixed order would fail on
	// whichever build apt hands out.
	depData, err := os.ReadFile(filepath.Join(k.ModulesDir, "modules.dep"))
	if err != nil {
		t.Fatal(err)
	}
	deps, _, err := parseDep(depData)
	if err != nil {
		t.Fatal(err)
	}
	prefix := "/lib/modules/" + k.Version + "/"
	checked := 0
	for i, m := range list {
		for _, d := range deps[strings.TrimPrefix(m, prefix)] {
			j, ok := pos[moduleName(d)]
			if !ok || j >= i {
				t.Errorf("%s needs %s (modules.dep), which is loaded at %d, not before %d", m, d, j, i)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Errorf("no dependency among the listed modules: modules.dep not read for %s", k.Version)
	}
	// What smx itself needs beyond modules.dep: ext4 needs crc32c at mount time.
	if ic, ie := pos["crc32c_generic"], pos["ext4"]; ic >= ie {
		t.Errorf("crc32c_generic (%d) must load before ext4 (%d)", ic, ie)
	}
	builtin, _ := os.ReadFile(filepath.Join(k.ModulesDir, "modules.builtin"))
	for _, m := range []string{"virtio_mmio", "virtio_console", "virtio_blk", "virtio_net", "ext4"} {
		if _, ok := pos[m]; !ok && !strings.Contains(string(builtin), "/"+m+".ko") {
			t.Errorf("%s not loaded", m)
		}
	}
	for _, m := range []string{"virtio_rng"} {
		if _, ok := pos[m]; !ok {
			t.Errorf("%s not loaded", m)
		}
	}

	// A different agent gives a different archive.
	os.WriteFile(agent, []byte("other"), 0o600)
	p3, err := Build(ctx, k, agent, out)
	if err != nil || p3 == p {
		t.Fatalf("changed agent: %s, %v", p3, err)
	}
}

// ownKernel writes a kernel cache entry like kernel.Build's: an empty
// modules.dep and a modules.builtin naming builtin.
func ownKernel(t *testing.T, builtin []string) *kernel.Kernel {
	t.Helper()
	dir := t.TempDir()
	k := &kernel.Kernel{Version: "6.1.172-smx-00000000", Dir: dir, Own: true,
		ModulesDir: filepath.Join(dir, "lib", "modules", "6.1.172-smx-00000000")}
	if err := os.MkdirAll(k.ModulesDir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(k.ModulesDir, "modules.dep"), nil, 0o644)
	var b strings.Builder
	for _, m := range builtin {
		b.WriteString("kernel/x/" + m + ".ko\n")
	}
	os.WriteFile(filepath.Join(k.ModulesDir, "modules.builtin"), []byte(b.String()), 0o644)
	return k
}

// A kernel with everything built in gets an archive with smx-agent and no
// module lists, so the guest loads nothing; one that lacks a driver smx
// needs (the shares' 9p included) is refused when the archive is built,
// not when a guest fails to find its disk.
func TestBuildBuiltinKernel(t *testing.T) {
	all := []string{"virtio_mmio", "virtio_console", "virtio_rng", "virtio_blk", "crc32c_generic", "ext4", "virtio_net", "9pnet_fd", "9p", "9pnet_virtio", "overlay"}
	agent := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(agent, []byte("agent"), 0o600)
	p, err := Build(context.Background(), ownKernel(t, all), agent, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range readNewc(t, b) {
		names = append(names, e.name)
	}
	if want := []string{"dev", "etc", "etc/smx", "dev/console", "init"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("archive = %v, want %v", names, want)
	}
	for _, missing := range []string{"ext4", "9p"} {
		var some []string
		for _, m := range all {
			if m != missing {
				some = append(some, m)
			}
		}
		_, err := Build(context.Background(), ownKernel(t, some), agent, t.TempDir())
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "module "+missing+" ") {
			t.Errorf("without %s: err = %v", missing, err)
		}
	}
}

// TestBuildOwnKernel builds the archive for smx's own kernel as
// `smx kernel build` left it in the cache.
func TestBuildOwnKernel(t *testing.T) {
	cache := os.Getenv("SMX_TEST_KERNEL_CACHE")
	var own *kernel.Kernel
	if cache != "" {
		if k, err := kernel.Find(cache); err == nil && k.Own {
			own = k
		}
	}
	testutil.Require(t, own != nil, "smx's own kernel in SMX_TEST_KERNEL_CACHE", "run `smx kernel build` (scripts/test.sh does)")
	agent := filepath.Join(t.TempDir(), "agent")
	os.WriteFile(agent, []byte("agent"), 0o600)
	p, err := Build(context.Background(), own, agent, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	for _, e := range readNewc(t, b) {
		if strings.HasPrefix(e.name, "lib/") || strings.HasPrefix(e.name, "etc/smx/modules") {
			t.Errorf("%s in the archive of a kernel without modules", e.name)
		}
	}
}

// A later build names the archive from the files' identity and times
// (the memo) without reading them; a file rewritten in place, at the
// same size, is read again; a file changed within racyWindow is never
// memoised.
func TestBuildMemo(t *testing.T) {
	k := ownKernel(t, []string{"virtio_mmio", "virtio_console", "virtio_rng", "virtio_blk", "crc32c_generic", "ext4", "virtio_net", "9pnet_fd", "9p", "9pnet_virtio", "overlay"})
	agent := filepath.Join(t.TempDir(), "agent")
	out := t.TempDir()
	if err := os.WriteFile(agent, []byte("agent-1"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := Build(ctx, k, agent, out); err != nil {
		t.Fatal(err)
	}
	if memos, _ := filepath.Glob(filepath.Join(out, "made-*")); len(memos) != 0 {
		t.Fatalf("memoised a file changed just now: %v", memos)
	}

	defer func(w time.Duration) { racyWindow = w }(racyWindow)
	racyWindow = 0
	p1, err := Build(ctx, k, agent, out)
	if err != nil {
		t.Fatal(err)
	}
	memos, _ := filepath.Glob(filepath.Join(out, "made-*"))
	if len(memos) != 1 {
		t.Fatalf("memos = %v, want one", memos)
	}
	// The memo is what answers: pointed at another archive, it is used.
	other := filepath.Join(out, "initramfs-other.cpio")
	os.WriteFile(other, []byte("x"), 0o600)
	os.WriteFile(memos[0], []byte("initramfs-other.cpio\n"), 0o644)
	if p, err := Build(ctx, k, agent, out); err != nil || p != other {
		t.Fatalf("with the memo: %s, %v; want %s", p, err, other)
	}
	// ...but never outside the cache directory.
	os.WriteFile(memos[0], []byte("../initramfs-other.cpio\n"), 0o644)
	if p, err := Build(ctx, k, agent, out); err != nil || p != p1 {
		t.Fatalf("memo naming another directory: %s, %v; want %s", p, err, p1)
	}
	// Rewritten in place at the same size, a clock tick later: another archive.
	time.Sleep(20 * time.Millisecond)
	if err := os.WriteFile(agent, []byte("agent-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	p3, err := Build(ctx, k, agent, out)
	if err != nil || p3 == p1 || p3 == other {
		t.Fatalf("after the agent changed: %s, %v", p3, err)
	}
	if b, _ := os.ReadFile(p3); !bytes.Contains(b, []byte("agent-2")) {
		t.Fatalf("archive %s lacks the new agent", p3)
	}
}

// The modules a distribution kernel's archive needs are resolved from its
// modules.dep once: later starts read them from a memo keyed by the
// identity of modules.dep and modules.builtin, which a change to either
// replaces, and which is never trusted to name files outside the modules
// directory.
func TestModulesMemo(t *testing.T) {
	dir := t.TempDir()
	k := &kernel.Kernel{Version: "6.1.0-99-amd64", Dir: dir, ModulesDir: filepath.Join(dir, "lib", "modules", "6.1.0-99-amd64")}
	os.MkdirAll(k.ModulesDir, 0o755)
	dep := filepath.Join(k.ModulesDir, "modules.dep")
	os.WriteFile(dep, []byte(syntheticDep), 0o644)
	var builtin strings.Builder
	for _, m := range []string{"virtio_console", "virtio_blk", "crc32c_generic", "ext4", "9pnet_fd", "9p", "9pnet_virtio"} {
		builtin.WriteString("kernel/x/" + m + ".ko\n")
	}
	os.WriteFile(filepath.Join(k.ModulesDir, "modules.builtin"), []byte(builtin.String()), 0o644)
	cache := t.TempDir()
	memos := func() []string { m, _ := filepath.Glob(filepath.Join(cache, "modules-*")); return m }

	want, _, err := modules(k, cache)
	if err != nil {
		t.Fatal(err)
	}
	if len(memos()) != 0 {
		t.Fatalf("memoised files changed just now: %v", memos())
	}
	defer func(w time.Duration) { racyWindow = w }(racyWindow)
	racyWindow = 0
	if got, _, err := modules(k, cache); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("modules = %q, %v; want %q", got, err, want)
	}
	if len(memos()) != 1 {
		t.Fatalf("memos = %v, want one", memos())
	}
	if !strings.HasSuffix(want[len(want)-1], "virtio_net.ko") || len(want) != 7 {
		t.Fatalf("resolved %q", want)
	}
	// The memo is what answers...
	memo := memos()[0]
	os.WriteFile(memo, []byte(`{"boot":["kernel/other.ko"]}`), 0o644)
	if got, _, err := modules(k, cache); err != nil || !reflect.DeepEqual(got, []string{"kernel/other.ko"}) {
		t.Fatalf("with the memo: %q, %v", got, err)
	}
	// ...but never with a path outside the modules directory.
	os.WriteFile(memo, []byte(`{"boot":["../../../etc/shadow"]}`), 0o644)
	if got, _, err := modules(k, cache); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("memo naming another directory: %q, %v; want %q", got, err, want)
	}
	// A changed modules.dep (virtio_net without its failover modules) is
	// resolved again.
	time.Sleep(20 * time.Millisecond)
	os.WriteFile(dep, []byte(strings.ReplaceAll(syntheticDep, "virtio_net.ko: kernel/drivers/net/net_failover.ko kernel/net/core/failover.ko", "virtio_net.ko:")), 0o644)
	got, _, err := modules(k, cache)
	if err != nil || len(got) != 5 || !strings.HasSuffix(got[len(got)-1], "virtio_net.ko") {
		t.Fatalf("after modules.dep changed: %q, %v", got, err)
	}
}
