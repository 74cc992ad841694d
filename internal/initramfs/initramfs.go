// Package initramfs builds the guest's initial ramdisk: smx-agent as /init
// and exactly the kernel modules it needs to reach its root disk, control
// channel, network and shares. The guest has no modprobe, so the archive
// also carries the load order, resolved on the host from modules.dep. For
// a kernel with all of them built in (smx's own) the archive is smx-agent
// alone, and Build checks modules.builtin for each.
package initramfs

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/statedir"
	"golang.org/x/sys/unix"
)

// ModulesList is where the archive lists module paths in load order.
const ModulesList = "/etc/smx/modules"

// formatVersion changes whenever the archive layout changes, so cached
// archives from an older smx are not reused.
const formatVersion = "smx-initramfs-3" // 2: module signatures stripped; 3: share modules

// requiredModules are loaded by smx-agent in this order of roots; each
// one's dependencies come first. crc32c_generic is listed because ext4
// pulls in crc32c through a softdep ("crypto-crc32c"), which only modprobe
// honours.
var requiredModules = []string{
	"virtio_mmio",    // the transport of every microvm device
	"virtio_console", // control channel (virtio-serial)
	"virtio_rng",     // entropy at boot
	"virtio_blk",     // root disk
	"crc32c_generic", // before ext4, see above
	"ext4",
	"virtio_net", // the one NIC, whose other end is the supervisor's gateway
	// Every module costs boot time under TCG (~10-40 ms each), so only
	// what the guest uses today is loaded: host shares (9p, 9pnet_fd)
	// and overlay join this list with the features that need them.
}

// optionalModules are loaded when the kernel has them.
var optionalModules = []string{}

// SharesList lists, in load order, the modules host shares need (9p over a
// file descriptor, and over virtio for benchmarks against QEMU's own 9p;
// overlay for read-only package caches, see internal/cache).
// They are in every archive but loaded only by sandboxes with mounts
// (smx.shares=1), so the others do not pay for them at boot.
const SharesList = "/etc/smx/modules.shares"

var sharesModules = []string{"9pnet_fd", "9p", "9pnet_virtio", "overlay"}

// Build returns the path of an uncompressed newc archive for k with the
// agent at agentPath as /init. Archives are cached in cacheDir under a hash
// of every input, so a second call with the same inputs only re-hashes.
// Uncompressed because the kernel unpacks it faster than it would
// decompress it, which matters under TCG.
func Build(ctx context.Context, k *kernel.Kernel, agentPath string, cacheDir string) (string, error) {
	mods, shares, err := modules(k, cacheDir)
	if err != nil {
		return "", err
	}
	// What the archive is made of, by file identity and change time: when
	// nothing changed since an earlier start, its name is known without
	// reading the agent (5 MB) and the modules again.
	files := append([]string{agentPath}, joinAll(k.ModulesDir, mods, shares)...)
	memo := memoPath(cacheDir, "made", k.Version, files)
	if dst := readMemo(cacheDir, memo); dst != "" {
		return dst, nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00", formatVersion, k.Version)
	if err := hashFile(h, agentPath); err != nil {
		return "", fmt.Errorf("initramfs: agent: %w: build smx-agent or reinstall smx", err)
	}
	fmt.Fprintf(h, "shares\x00")
	for _, m := range append(append([]string{}, mods...), shares...) {
		if err := ctx.Err(); err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00", m)
		if err := hashFile(h, filepath.Join(k.ModulesDir, m)); err != nil {
			return "", fmt.Errorf("initramfs: module: %w: run `smx setup`", err)
		}
	}
	dst := filepath.Join(cacheDir, "initramfs-"+hex.EncodeToString(h.Sum(nil))+".cpio")
	if _, err := os.Stat(dst); err != nil {
		if err := os.MkdirAll(cacheDir, 0o755); err != nil {
			return "", fmt.Errorf("initramfs: %w", err)
		}
		if err := write(dst, k, agentPath, mods, shares); err != nil {
			return "", fmt.Errorf("initramfs: build %s: %w", dst, err)
		}
	}
	if memo != "" {
		// Best effort: without it the next start hashes again.
		_ = statedir.WriteFileAtomic(memo, []byte(filepath.Base(dst)+"\n"), 0o644)
	}
	return dst, nil
}

// modules returns the module paths (relative to k.ModulesDir) the archive
// for k loads at boot, in load order, and those it carries for shares. A
// memo keyed by the identity of modules.dep and modules.builtin (see
// memoPath) answers when neither changed: parsing a distribution kernel's
// modules.dep (some 4,000 modules) cost each start 20-60 ms.
func modules(k *kernel.Kernel, cacheDir string) (mods, shares []string, err error) {
	// A distribution kernel may lack the share modules (shares then fail
	// at mount time); smx's own kernel must have them built in.
	sharesOptional := sharesModules
	if k.Own {
		sharesOptional = nil
	}
	boot := append(append([]string{}, requiredModules...), optionalModules...)
	key := fmt.Sprintf("%s\x00%q %q %q %q", k.Version, boot, optionalModules, sharesModules, sharesOptional)
	memo := memoPath(cacheDir, "modules", key, []string{
		filepath.Join(k.ModulesDir, "modules.dep"), filepath.Join(k.ModulesDir, "modules.builtin")})
	if memo != "" {
		var m moduleMemo
		if b, err := os.ReadFile(memo); err == nil && json.Unmarshal(b, &m) == nil && m.local() {
			return m.Boot, m.Shares, nil
		}
	}
	if mods, err = resolve(k.ModulesDir, boot, optionalModules); err != nil {
		return nil, nil, err
	}
	if shares, err = resolve(k.ModulesDir, sharesModules, sharesOptional); err != nil {
		return nil, nil, err
	}
	shares = without(shares, mods)
	if memo != "" {
		if err := os.MkdirAll(cacheDir, 0o755); err == nil {
			b, _ := json.Marshal(moduleMemo{Boot: mods, Shares: shares})
			// Best effort: without it the next start parses again.
			_ = statedir.WriteFileAtomic(memo, b, 0o644)
		}
	}
	return mods, shares, nil
}

// moduleMemo is what modules remembers.
type moduleMemo struct {
	Boot   []string `json:"boot"`
	Shares []string `json:"shares"`
}

// local reports whether every path stays inside the modules directory
// (a memo is never trusted to name other files for the archive).
func (m moduleMemo) local() bool {
	for _, p := range append(append([]string{}, m.Boot...), m.Shares...) {
		if !filepath.IsLocal(p) {
			return false
		}
	}
	return true
}

// readMemo returns the archive memo names, when memo is set and names an
// archive that exists in cacheDir (a name with a directory in it is not
// taken), or "".
func readMemo(cacheDir, memo string) string {
	if memo == "" {
		return ""
	}
	b, err := os.ReadFile(memo)
	if err != nil {
		return ""
	}
	name := strings.TrimSpace(string(b))
	if name == "" || name != filepath.Base(name) {
		return ""
	}
	dst := filepath.Join(cacheDir, name)
	if _, err := os.Stat(dst); err != nil {
		return ""
	}
	return dst
}

// racyWindow: see memoPath.
var racyWindow = 2 * time.Second

func joinAll(dir string, lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, m := range l {
			out = append(out, filepath.Join(dir, m))
		}
	}
	return out
}

// memoPath names the file (kind-HASH in cacheDir) that remembers what is
// derived from files: a hash of the format, key and each file's path,
// device, inode, size, modification and change times (nanoseconds). Any
// write to a file, or its replacement, changes its change time or inode,
// so a stale memo is never used. It is "" when a file cannot be examined,
// or changed less than racyWindow ago: the kernel stamps times at its
// clock tick, so two writes in one tick can leave the same times (git's
// "racy" files).
func memoPath(cacheDir, kind, key string, files []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", formatVersion, kind, key)
	for _, f := range files {
		var st unix.Stat_t
		if err := unix.Stat(f, &st); err != nil {
			return ""
		}
		if time.Since(time.Unix(st.Ctim.Sec, st.Ctim.Nsec)) < racyWindow {
			return ""
		}
		fmt.Fprintf(h, "%s\x00%d %d %d %d.%d %d.%d\x00", f, st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return filepath.Join(cacheDir, kind+"-"+hex.EncodeToString(h.Sum(nil))[:32])
}

func hashFile(h io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(h, f)
	return err
}

// write builds the archive in a temporary file and renames it into place
// so a reader never sees a partial archive.
func write(dst string, k *kernel.Kernel, agentPath string, mods, shares []string) (err error) {
	f, err := os.CreateTemp(filepath.Dir(dst), ".initramfs-*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	c := &newcWriter{w: bw}

	modRoot := "lib/modules/" + k.Version
	var list bytes.Buffer
	for _, m := range mods {
		fmt.Fprintf(&list, "/%s/%s\n", modRoot, m)
	}
	// Directories first and explicitly, with 0755: an unpacker that has to
	// create a parent for a file picks its own (looser) mode.
	dirs := map[string]bool{"dev": true, "etc": true, "etc/smx": true}
	for _, m := range append(append([]string{}, mods...), shares...) {
		for d := path.Dir(modRoot + "/" + m); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	sorted := make([]string, 0, len(dirs))
	for d := range dirs {
		sorted = append(sorted, d)
	}
	sort.Strings(sorted) // parents sort before children
	for _, d := range sorted {
		if err := c.dir(d); err != nil {
			return err
		}
	}
	// The kernel opens /dev/console for init's stdio before init runs.
	// Debian kernels carry it in their built-in archive, but a kernel
	// built with its own initramfs source may not.
	if err := c.charDev("dev/console", 0o600, 5, 1); err != nil {
		return err
	}
	if err := copyFile(c, "init", 0o755, agentPath); err != nil {
		return err
	}
	var shareList bytes.Buffer
	for _, m := range shares {
		fmt.Fprintf(&shareList, "/%s/%s\n", modRoot, m)
	}
	for _, m := range append(append([]string{}, mods...), shares...) {
		b, err := os.ReadFile(filepath.Join(k.ModulesDir, m))
		if err != nil {
			return err
		}
		b = StripSignature(b)
		if err := c.file(modRoot+"/"+m, 0o644, int64(len(b)), bytes.NewReader(b)); err != nil {
			return err
		}
	}
	// A kernel with everything built in (smx's own) gets no lists, and
	// smx-agent then has nothing to load.
	if len(mods) > 0 {
		if err := c.file(strings.TrimPrefix(ModulesList, "/"), 0o644, int64(list.Len()), &list); err != nil {
			return err
		}
	}
	if len(shares) > 0 {
		if err := c.file(strings.TrimPrefix(SharesList, "/"), 0o644, int64(shareList.Len()), &shareList); err != nil {
			return err
		}
	}
	if err := c.close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	// Sync before rename: the name promises the content, and a crash must
	// not leave an empty file under it.
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), dst)
}

func copyFile(c *newcWriter, name string, perm uint32, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	return c.file(name, perm, fi.Size(), f)
}

// moduleName turns a modules.dep path into the module's name:
// kernel/drivers/char/hw_random/virtio-rng.ko -> virtio_rng.
func moduleName(p string) string {
	base := path.Base(p)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i] // also strips .ko.xz, .ko.zst
	}
	return strings.ReplaceAll(base, "-", "_")
}

// resolve reads modules.dep and modules.builtin in modDir and returns the
// module paths (relative to modDir) to load for names, dependencies first.
// Built-in names are skipped; a name that is neither is an error unless it
// is in optional.
func resolve(modDir string, names, optional []string) ([]string, error) {
	depData, err := os.ReadFile(filepath.Join(modDir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("initramfs: %w: %w: run `smx setup`", errdefs.ErrNotFound, err)
	}
	deps, byName, err := parseDep(depData)
	if err != nil {
		return nil, err
	}
	builtin := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(modDir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(b)) {
			builtin[moduleName(l)] = true
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("initramfs: %w", err)
	}
	var roots []string
	for _, n := range names {
		n = strings.ReplaceAll(n, "-", "_")
		switch p, ok := byName[n]; {
		case ok:
			roots = append(roots, p)
		case builtin[n]:
		case contains(optional, n):
		default:
			return nil, fmt.Errorf("initramfs: kernel module %s is neither in modules.dep nor built in (%s): %w: this kernel cannot run smx guests; use a Debian linux-image-amd64 kernel (`smx setup`) or smx's own (`smx setup --kernel smx`)", n, modDir, errdefs.ErrNotFound)
		}
	}
	return loadOrder(deps, roots)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// parseDep parses modules.dep lines "path: dep1 dep2 ..." into a map from
// path to dependencies and one from module name to path.
func parseDep(data []byte) (deps map[string][]string, byName map[string]string, err error) {
	deps = map[string][]string{}
	byName = map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			return nil, nil, fmt.Errorf("initramfs: modules.dep:%d: no colon: %w", i+1, errdefs.ErrInvalid)
		}
		mod = strings.TrimSpace(mod)
		deps[mod] = strings.Fields(rest)
		byName[moduleName(mod)] = mod
	}
	return deps, byName, nil
}

// loadOrder returns roots and everything they depend on, each once, with
// every module after all of its dependencies. depmod lists a module's
// dependencies so that the last must be loaded first ("virtio_mmio.ko:
// virtio.ko virtio_ring.ko" means virtio_ring, virtio, virtio_mmio); we
// recurse instead of trusting that order, which also survives a
// hand-edited or partial modules.dep.
func loadOrder(deps map[string][]string, roots []string) ([]string, error) {
	const (
		visiting = 1
		done     = 2
	)
	state := map[string]int{}
	var order []string
	var visit func(m string, from string) error
	visit = func(m, from string) error {
		switch state[m] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("initramfs: modules.dep: dependency cycle through %s: %w", m, errdefs.ErrInvalid)
		}
		d, ok := deps[m]
		if !ok {
			return fmt.Errorf("initramfs: modules.dep: %s (needed by %s) is not listed: %w: run `smx setup` again", m, from, errdefs.ErrNotFound)
		}
		state[m] = visiting
		for i := len(d) - 1; i >= 0; i-- {
			if err := visit(d[i], m); err != nil {
				return err
			}
		}
		state[m] = done
		order = append(order, m)
		return nil
	}
	for _, r := range roots {
		if err := visit(r, "smx"); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// moduleSigMagic ends a signed kernel module (scripts/sign-file.c).
const moduleSigMagic = "~Module signature appended~\n"

// StripSignature removes the appended signature from a kernel module. The
// guest kernel then loads it without verifying an RSA signature over a
// SHA-256 of the whole module, which under TCG is most of the cost of
// loading ext4 (it only taints the kernel; Debian kernels do not enforce
// signatures outside lockdown). The modules come from the distribution's
// package, verified by apt on the host; the guest kernel is inside the
// sandbox and trusts nothing more for having checked them again.
func StripSignature(b []byte) []byte {
	if !bytes.HasSuffix(b, []byte(moduleSigMagic)) {
		return b
	}
	// struct module_signature (12 bytes) precedes the magic; its last four
	// bytes are the big-endian signature length.
	end := len(b) - len(moduleSigMagic)
	if end < 12 {
		return b
	}
	sigLen := int(binary.BigEndian.Uint32(b[end-4 : end]))
	start := end - 12 - sigLen
	if start < 0 {
		return b
	}
	return b[:start]
}

// without returns the elements of a not in b, in order.
func without(a, b []string) []string {
	seen := map[string]bool{}
	for _, x := range b {
		seen[x] = true
	}
	var out []string
	for _, x := range a {
		if !seen[x] {
			out = append(out, x)
		}
	}
	return out
}
