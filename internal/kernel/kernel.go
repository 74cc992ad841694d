// Package kernel keeps guest kernels in the smx cache, one directory per
// kernel version: the distribution's kernel package, fetched with its
// package tool and unpacked with its module dependency data, and smx's own
// kernel, built from the distribution's kernel source with Config and
// everything built in (Build).
//
// Layout: CACHE/VERSION/vmlinuz and CACHE/VERSION/lib/modules/VERSION/; an
// own kernel also has vmlinux, config and smx-build.json, and an empty
// modules.dep beside its modules.builtin.
package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/hosttool"
)

// Kernel is an unpacked kernel in the cache.
type Kernel struct {
	Version string // e.g. 6.1.0-57-amd64
	Dir     string // CACHE/VERSION
	Vmlinuz string // Dir/vmlinuz, the compressed bzImage
	// Vmlinux is the uncompressed ELF kernel (Dir/vmlinux) or empty when it
	// could not be extracted. QEMU boots it through PVH, skipping the
	// bzImage's self-decompression, which under TCG takes over 2 s.
	Vmlinux    string
	ModulesDir string // Dir/lib/modules/VERSION, holding modules.dep
	// Own is set for smx's own kernel (Build): no loadable modules,
	// everything the guest uses built in.
	Own bool
}

// BootImage is the kernel file to hand to QEMU: Vmlinux when there is one.
func (k *Kernel) BootImage() string {
	if k.Vmlinux != "" {
		return k.Vmlinux
	}
	return k.Vmlinuz
}

// metaPackage is Debian's package that always depends on the current kernel.
const metaPackage = "linux-image-amd64"

const tmpPrefix = ".tmp-"

// Find returns the kernel new sandboxes get: the newest own kernel in
// cacheDir, or when none is built the newest distribution kernel. It never
// downloads or builds.
func Find(cacheDir string) (*Kernel, error) {
	ents, err := os.ReadDir(cacheDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("kernel: find: %w", err)
	}
	var best *Kernel
	for _, e := range ents {
		// A version may be a symlink to a kernel kept elsewhere.
		if !e.IsDir() && e.Type()&os.ModeSymlink == 0 || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		k, ok := load(cacheDir, e.Name())
		if ok && (best == nil || preferred(k, best)) {
			best = k
		}
	}
	if best == nil {
		return nil, fmt.Errorf("kernel: no guest kernel in %s: run `smx setup`: %w", cacheDir, errdefs.ErrNotFound)
	}
	return best, nil
}

// Load returns the cached kernel of that exact version: a sandbox or
// snapshot pinned to it boots nothing else.
func Load(cacheDir, version string) (*Kernel, error) {
	if version == "" || version != filepath.Base(version) || strings.HasPrefix(version, ".") {
		return nil, fmt.Errorf("kernel: invalid version %q: %w", version, errdefs.ErrInvalid)
	}
	k, ok := load(cacheDir, version)
	if !ok {
		return nil, fmt.Errorf("kernel: guest kernel %s is not in %s: it was removed; `smx kernel ls` shows what is cached: %w", version, cacheDir, errdefs.ErrNotFound)
	}
	return k, nil
}

// List returns every complete kernel in cacheDir, newest first.
func List(cacheDir string) ([]*Kernel, error) {
	ents, err := os.ReadDir(cacheDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("kernel: list: %w", err)
	}
	var ks []*Kernel
	for _, e := range ents {
		// A version may be a symlink to a kernel kept elsewhere.
		if !e.IsDir() && e.Type()&os.ModeSymlink == 0 || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if k, ok := load(cacheDir, e.Name()); ok {
			ks = append(ks, k)
		}
	}
	sort.Slice(ks, func(i, j int) bool { return preferred(ks[i], ks[j]) })
	return ks, nil
}

// preferred orders kernels for new sandboxes: own kernels first (they boot
// without loading modules), then by version, newest first.
func preferred(a, b *Kernel) bool {
	if a.Own != b.Own {
		return a.Own
	}
	return compareVersions(a.Version, b.Version) > 0
}

// FindStock returns the newest distribution (modular) kernel in cacheDir,
// for what must run on the stock kernel whatever else is cached.
func FindStock(cacheDir string) (*Kernel, error) {
	ks, err := List(cacheDir)
	if err != nil {
		return nil, err
	}
	for _, k := range ks {
		if !k.Own {
			return k, nil
		}
	}
	return nil, fmt.Errorf("kernel: no distribution kernel in %s: run `smx setup`: %w", cacheDir, errdefs.ErrNotFound)
}

// Remove deletes a cached kernel. The caller checks that nothing is pinned
// to it. The directory is renamed away first, so a concurrent Find never
// sees half a kernel.
func Remove(cacheDir, version string) error {
	k, err := Load(cacheDir, version)
	if err != nil {
		return err
	}
	tomb := filepath.Join(cacheDir, tmpPrefix+"rm-"+version)
	if err := os.Rename(k.Dir, tomb); err != nil {
		return fmt.Errorf("kernel: remove %s: %w", version, err)
	}
	if err := os.RemoveAll(tomb); err != nil {
		return fmt.Errorf("kernel: remove %s: %w", version, err)
	}
	return nil
}

// load returns the kernel in cacheDir/version if it is complete.
func load(cacheDir, version string) (*Kernel, bool) {
	dir := filepath.Join(cacheDir, version)
	k := &Kernel{
		Version:    version,
		Dir:        dir,
		Vmlinuz:    filepath.Join(dir, "vmlinuz"),
		ModulesDir: filepath.Join(dir, "lib", "modules", version),
	}
	for _, p := range []string{k.Vmlinuz, filepath.Join(k.ModulesDir, "modules.dep")} {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			return nil, false
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "vmlinux")); err == nil && fi.Mode().IsRegular() {
		k.Vmlinux = filepath.Join(dir, "vmlinux")
	}
	if _, err := os.Stat(filepath.Join(dir, ownMarker)); err == nil {
		k.Own = true
	}
	return k, true
}

// Ensure makes sure the kernel that linux-image-amd64 currently points to
// is in cacheDir, downloading and unpacking it if needed, and returns it.
// When it is already cached Ensure costs one apt-cache call. When the
// package tool cannot deliver but some kernel is cached, that one is used.
// Progress lines go to progress (which may be nil).
func Ensure(ctx context.Context, cacheDir string, progress io.Writer) (*Kernel, error) {
	if progress == nil {
		progress = io.Discard
	}
	if k, ok := fresh(cacheDir); ok {
		return withVmlinux(ctx, k, progress), nil
	}
	pkg, err := resolvePackage(ctx)
	if err == nil {
		version := strings.TrimPrefix(pkg, "linux-image-")
		if k, ok := load(cacheDir, version); ok {
			markChecked(cacheDir, version)
			return withVmlinux(ctx, k, progress), nil
		}
		var k *Kernel
		if k, err = fetch(ctx, cacheDir, pkg, version, progress); err == nil {
			markChecked(cacheDir, version)
			return withVmlinux(ctx, k, progress), nil
		}
	}
	if k, ferr := Find(cacheDir); ferr == nil {
		fmt.Fprintf(progress, "kernel: %v\nkernel: using cached kernel %s\n", err, k.Version)
		return k, nil
	}
	return nil, err
}

// aptLists changes (its mtime) whenever apt-get update brings new package
// lists, which is the only time linux-image-amd64 can point elsewhere.
var aptLists = "/var/lib/apt/lists"

// checkedFile records which version apt named at the last check. Asking
// apt-cache costs half a second, too much for every smx run.
const checkedFile = ".apt-checked"

// fresh returns the kernel apt named at the last check if apt's lists have
// not changed since.
func fresh(cacheDir string) (*Kernel, bool) {
	stamp := filepath.Join(cacheDir, checkedFile)
	st, err := os.Stat(stamp)
	if err != nil {
		return nil, false
	}
	lists, err := os.Stat(aptLists)
	if err != nil || lists.ModTime().After(st.ModTime()) {
		return nil, false
	}
	b, err := os.ReadFile(stamp)
	if err != nil {
		return nil, false
	}
	return load(cacheDir, strings.TrimSpace(string(b)))
}

func markChecked(cacheDir, version string) {
	// Best effort: without the stamp the next Ensure just asks apt again.
	tmp := filepath.Join(cacheDir, checkedFile+".tmp")
	if os.WriteFile(tmp, []byte(version+"\n"), 0o644) == nil {
		os.Rename(tmp, filepath.Join(cacheDir, checkedFile))
	}
}

var kernelPkgRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^linux-image-[0-9][^ ]*$`) })

// resolvePackage asks apt which versioned package the metapackage wants.
func resolvePackage(ctx context.Context) (string, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return "", fmt.Errorf("kernel: apt-cache not found: %w: smx fetches the guest kernel with apt; on other systems unpack a kernel into CACHE/VERSION/ (vmlinuz, lib/modules/VERSION with modules.dep)", errdefs.ErrUnavailable)
	}
	out, err := run(ctx, "", "apt-cache", "depends", metaPackage)
	if err != nil {
		// apt-cache exits non-zero for an unknown package.
		return "", fmt.Errorf("kernel: %s is unknown to apt: %w: run `apt-get update` (as root), then `smx setup` (%v)", metaPackage, errdefs.ErrNotFound, err)
	}
	for _, line := range strings.Split(out, "\n") {
		key, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || strings.TrimLeft(key, "|") != "Depends" {
			continue
		}
		if val = strings.TrimSpace(val); kernelPkgRE().MatchString(val) {
			return val, nil
		}
	}
	return "", fmt.Errorf("kernel: %s depends on no linux-image-VERSION package: %w: run `apt-get update`", metaPackage, errdefs.ErrNotFound)
}

// fetch downloads pkg and installs it as cacheDir/version. Work happens in
// a temporary directory inside cacheDir so the final rename is atomic and
// a crash leaves no half-unpacked kernel under a real version name.
func fetch(ctx context.Context, cacheDir, pkg, version string, progress io.Writer) (*Kernel, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	tmp, err := os.MkdirTemp(cacheDir, tmpPrefix)
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	defer os.RemoveAll(tmp)

	fmt.Fprintf(progress, "kernel: downloading %s\n", pkg)
	dl := filepath.Join(tmp, "download")
	if err := os.Mkdir(dl, 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	args := []string{"download", pkg}
	if os.Geteuid() == 0 {
		// As root apt drops to _apt for downloads, which cannot write into
		// our private cache and so warns and falls back to root anyway.
		args = append([]string{"-o", "APT::Sandbox::User=root"}, args...)
	}
	if _, err := run(ctx, dl, "apt-get", args...); err != nil {
		return nil, fmt.Errorf("kernel: download %s: %w: check the network and apt sources, or run `apt-get update` (%v)", pkg, errdefs.ErrUnavailable, err)
	}
	debs, _ := filepath.Glob(filepath.Join(dl, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("kernel: download %s: got %d .deb files, want 1: %w", pkg, len(debs), errdefs.ErrFailed)
	}

	fmt.Fprintf(progress, "kernel: unpacking %s\n", filepath.Base(debs[0]))
	x := filepath.Join(tmp, "x")
	if _, err := run(ctx, "", "dpkg-deb", "-x", debs[0], x); err != nil {
		return nil, fmt.Errorf("kernel: unpack %s: %w: %v", debs[0], errdefs.ErrFailed, err)
	}
	out := filepath.Join(tmp, "out")
	if err := os.MkdirAll(filepath.Join(out, "lib", "modules"), 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	if err := os.Rename(filepath.Join(x, "boot", "vmlinuz-"+version), filepath.Join(out, "vmlinuz")); err != nil {
		return nil, fmt.Errorf("kernel: %s has no boot/vmlinuz-%s: %w: %v", pkg, version, errdefs.ErrFailed, err)
	}
	mods := filepath.Join(x, "lib", "modules", version)
	if _, err := os.Stat(mods); err != nil {
		mods = filepath.Join(x, "usr", "lib", "modules", version) // merged-/usr packages
	}
	if err := os.Rename(mods, filepath.Join(out, "lib", "modules", version)); err != nil {
		return nil, fmt.Errorf("kernel: %s has no lib/modules/%s: %w: %v", pkg, version, errdefs.ErrFailed, err)
	}

	// The package ships no modules.dep: its postinst runs depmod on the
	// host. We need it to resolve module dependencies for the initramfs.
	fmt.Fprintf(progress, "kernel: running depmod for %s\n", version)
	if _, err := run(ctx, "", depmodPath(), "-b", out, version); err != nil {
		return nil, fmt.Errorf("kernel: depmod: %w: install kmod (%v)", errdefs.ErrUnavailable, err)
	}

	dst := filepath.Join(cacheDir, version)
	if err := os.Rename(out, dst); err != nil {
		// Another smx may have installed the same kernel meanwhile.
		if k, ok := load(cacheDir, version); ok {
			return k, nil
		}
		return nil, fmt.Errorf("kernel: install %s: %w", dst, err)
	}
	k, ok := load(cacheDir, version)
	if !ok {
		return nil, fmt.Errorf("kernel: %s is incomplete after install: %w", dst, errdefs.ErrFailed)
	}
	k = withVmlinux(ctx, k, progress)
	fmt.Fprintf(progress, "kernel: %s ready in %s\n", version, dst)
	return k, nil
}

// xzMagic starts the xz stream inside a Debian bzImage (CONFIG_KERNEL_XZ).
var xzMagic = []byte("\xfd7zXZ\x00")

// withVmlinux extracts the uncompressed kernel next to vmlinuz if it is not
// there yet. It is best effort: without xz, or for a kernel compressed some
// other way, k keeps booting from vmlinuz, only slower.
func withVmlinux(ctx context.Context, k *Kernel, progress io.Writer) *Kernel {
	if k.Vmlinux != "" {
		return k
	}
	xz, err := exec.LookPath("xz")
	if err != nil {
		return k
	}
	img, err := os.ReadFile(k.Vmlinuz)
	if err != nil {
		return k
	}
	off := bytes.Index(img, xzMagic)
	if off < 0 {
		return k
	}
	fmt.Fprintf(progress, "kernel: extracting vmlinux for faster boot\n")
	dst := filepath.Join(k.Dir, "vmlinux")
	f, err := os.CreateTemp(k.Dir, ".vmlinux-*")
	if err != nil {
		return k
	}
	defer os.Remove(f.Name()) // no-op after the rename
	cmd := exec.CommandContext(ctx, xz, "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(img[off:])
	cmd.Stdout = f
	err = cmd.Run()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(progress, "kernel: extract vmlinux: %v (booting from vmlinuz)\n", err)
		return k
	}
	// Only an ELF image can be booted through PVH.
	if !isELF(f.Name()) || os.Chmod(f.Name(), 0o644) != nil {
		return k
	}
	if err := os.Rename(f.Name(), dst); err != nil {
		return k
	}
	kk := *k
	kk.Vmlinux = dst
	return &kk
}

func isELF(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	hdr := make([]byte, 4)
	_, err = io.ReadFull(f, hdr)
	return err == nil && string(hdr) == "\x7fELF"
}

// depmodPath finds depmod, which lives in /usr/sbin and so is missing from
// many users' PATH.
func depmodPath() string {
	if p, err := hosttool.Look("depmod"); err == nil {
		return p
	}
	return "depmod"
}

// run runs a command and returns its stdout; on failure the error carries
// the last line of its stderr, which is where apt and dpkg explain.
func run(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		if msg != "" {
			return "", fmt.Errorf("%s: %w: %s", name, err, msg)
		}
		return "", fmt.Errorf("%s: %w", name, err)
	}
	return stdout.String(), nil
}

// compareVersions orders kernel versions naturally, so 6.1.0-10 sorts after
// 6.1.0-9: runs of digits compare as numbers, everything else as text.
func compareVersions(a, b string) int {
	for a != "" && b != "" {
		ra, rest1 := splitRun(a)
		rb, rest2 := splitRun(b)
		if c := compareRun(ra, rb); c != 0 {
			return c
		}
		a, b = rest1, rest2
	}
	return len(a) - len(b)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func splitRun(s string) (run, rest string) {
	d := isDigit(s[0])
	i := 1
	for i < len(s) && isDigit(s[i]) == d {
		i++
	}
	return s[:i], s[i:]
}

func compareRun(a, b string) int {
	if isDigit(a[0]) && isDigit(b[0]) {
		a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
		if len(a) != len(b) {
			return len(a) - len(b)
		}
	}
	return strings.Compare(a, b)
}
