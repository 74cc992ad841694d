package kernel

import (
	"bufio"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Config is smx's guest kernel configuration: a fragment applied on top
// of `make allnoconfig`, with everything the guest uses built in and no
// modules.
//
//go:embed config/smx.config
var Config []byte

// SourcePackage is the distribution's kernel source package the own kernel
// is built from.
const SourcePackage = "linux-source-6.1"

// recipe changes whenever Build produces a different kernel from the same
// source and Config (other make variables, another install layout), so a
// kernel cached by an older smx is not taken for the new one.
const recipe = "smx-kernel-build-2" // 2: build timestamp from the source, a date

// ownMarker is the file that marks a cache entry as built by Build; it
// holds the BuildInfo.
const ownMarker = "smx-build.json"

// BuildInfo describes an own kernel; it is kept in the cache beside it.
type BuildInfo struct {
	Version       string  `json:"version"` // uname -r, also the cache directory's name
	SourcePackage string  `json:"source_package"`
	SourceVersion string  `json:"source_version"` // the package's version, e.g. 6.1.172-1
	ConfigSHA256  string  `json:"config_sha256"`  // of Config
	Recipe        string  `json:"recipe"`
	BuildSeconds  float64 `json:"build_seconds"`
	Jobs          int     `json:"jobs"`
}

// OwnVersion is the version (uname -r and cache name) of the own kernel
// built from the source package at sourceVersion with Config:
// 6.1.172-smx-<hash8>, where the hash covers the package version, Config
// and the build recipe.
func OwnVersion(sourceVersion string) string {
	upstream, _, _ := strings.Cut(sourceVersion, "-")
	return upstream + "-smx-" + buildKey(sourceVersion)[:8]
}

func buildKey(sourceVersion string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", recipe, SourcePackage, sourceVersion)
	h.Write(Config)
	return hex.EncodeToString(h.Sum(nil))
}

// IsOwn reports whether a kernel version names an own kernel.
func IsOwn(version string) bool { return strings.Contains(version, "-smx-") }

// FindOwn returns the own kernel for the source package apt offers now if
// it is cached. It asks apt-cache (about half a second) and never builds.
func FindOwn(ctx context.Context, cacheDir string) (*Kernel, error) {
	sv, err := sourceVersion(ctx)
	if err != nil {
		return nil, err
	}
	return Load(cacheDir, OwnVersion(sv))
}

// BuildOptions tune Build.
type BuildOptions struct {
	// Jobs is make's -j; 0 means the number of CPUs.
	Jobs int
	// Nice lowers the compiler's priority (nice -n 10), for builds that
	// share the machine.
	Nice bool
	// Progress gets a line when each phase starts and every 30 s while
	// compiling; nil discards.
	Progress io.Writer
	// WorkDir is where the source is unpacked (WorkDir/linux-source-6.1)
	// and compiled (WorkDir/out); it is kept, so the next build (another
	// configuration, say) only compiles what changed. Empty: a directory in
	// the cache named by the source version, kept after a failed or
	// interrupted build (the next one resumes) and removed after success.
	WorkDir string
}

// buildTools are what Build needs on the host besides apt, with the
// Debian package providing each.
var buildTools = []struct{ file, pkg string }{
	{"make", "make"}, {"gcc", "gcc"}, {"flex", "flex"}, {"bison", "bison"},
	{"bc", "bc"}, {"perl", "perl"}, {"xz", "xz-utils"}, {"tar", "tar"},
	{"/usr/include/gelf.h", "libelf-dev"}, {"/usr/include/openssl/ssl.h", "libssl-dev"},
}

// BuildPackages are the Debian packages Build needs.
func BuildPackages() []string {
	var p []string
	for _, t := range buildTools {
		p = append(p, t.pkg)
	}
	return p
}

// Build makes sure the own kernel for the source package apt offers now is
// in cacheDir, building it if needed (minutes: see docs/architecture.md),
// and returns it. The work happens in a temporary directory inside
// cacheDir, renamed into place when complete; it needs about 1.5 GB while
// it runs. The build is reproducible: timestamp, user and host are fixed.
func Build(ctx context.Context, cacheDir string, opts BuildOptions) (*Kernel, error) {
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	sv, err := sourceVersion(ctx)
	if err != nil {
		return nil, err
	}
	version := OwnVersion(sv)
	if k, ok := load(cacheDir, version); ok {
		return k, nil
	}
	var missing []string
	for _, t := range buildTools {
		if strings.HasPrefix(t.file, "/") {
			if _, err := os.Stat(t.file); err != nil {
				missing = append(missing, t.pkg)
			}
		} else if _, err := exec.LookPath(t.file); err != nil {
			missing = append(missing, t.pkg)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("kernel: build: missing %s: %w: run `apt-get install %s` (as root; `smx setup --kernel smx` does it)", strings.Join(missing, ", "), errdefs.ErrUnavailable, strings.Join(missing, " "))
	}
	jobs := opts.Jobs
	if jobs <= 0 {
		jobs = runtime.NumCPU()
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	tmp := opts.WorkDir
	if tmp == "" {
		tmp = filepath.Join(cacheDir, tmpPrefix+"build-"+SourcePackage+"_"+sv)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	// One build per work directory at a time; a second smx waits, then
	// finds the kernel built.
	lock, err := os.OpenFile(filepath.Join(tmp, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		fmt.Fprintf(progress, "kernel: waiting for another build in %s\n", tmp)
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
			return nil, fmt.Errorf("kernel: lock %s: %w", tmp, err)
		}
	}
	if k, ok := load(cacheDir, version); ok {
		return k, nil
	}
	start := time.Now()

	src := filepath.Join(tmp, SourcePackage)
	if _, err := os.Stat(filepath.Join(src, "Makefile")); err != nil {
		if err := unpackSource(ctx, tmp, sv, progress); err != nil {
			return nil, err
		}
	}
	out := filepath.Join(tmp, "out")
	cfg := filepath.Join(tmp, "smx.config")
	if err := os.WriteFile(cfg, Config, 0o644); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	local := strings.TrimPrefix(version, strings.SplitN(version, "-", 2)[0])
	// Reproducible: nothing of this host or this moment in the image. The
	// timestamp is the source's own (its Makefile's mtime, from the
	// package), and a date, because the built-in initramfs takes its
	// files' mtimes from it (and from the clock when it does not parse).
	mf, err := os.Stat(filepath.Join(src, "Makefile"))
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	stamp := mf.ModTime().UTC().Format("Mon Jan 2 15:04:05 UTC 2006")
	env := append(os.Environ(), "LC_ALL=C", "TZ=UTC",
		"KCONFIG_ALLCONFIG="+cfg,
		"KBUILD_BUILD_TIMESTAMP="+stamp, "KBUILD_BUILD_USER=smx",
		"KBUILD_BUILD_HOST=smx", "KBUILD_BUILD_VERSION=1")
	makeArgs := func(target ...string) []string {
		return append([]string{"-C", src, "O=" + out, "ARCH=x86_64", "LOCALVERSION=" + local}, target...)
	}
	fmt.Fprintf(progress, "kernel: configuring %s\n", version)
	if err := runEnv(ctx, env, nil, "make", makeArgs("allnoconfig")...); err != nil {
		return nil, fmt.Errorf("kernel: configure: %w: %v", errdefs.ErrFailed, err)
	}
	if err := checkConfig(Config, filepath.Join(out, ".config")); err != nil {
		return nil, err
	}

	fmt.Fprintf(progress, "kernel: compiling %s with %d jobs (about 10 minutes on 2 idle cores, longer on a busy machine)\n", version, jobs)
	name, margs := "make", makeArgs("-j"+fmt.Sprint(jobs), "bzImage")
	if opts.Nice {
		if p, err := exec.LookPath("nice"); err == nil {
			name, margs = p, append([]string{"-n", "10", "make"}, margs...)
		}
	}
	var compiled atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fmt.Fprintf(progress, "kernel: compiling: %d files, %s\n", compiled.Load(), time.Since(start).Round(time.Second))
			}
		}
	}()
	if err := runEnv(ctx, env, func(line string) {
		if strings.HasPrefix(line, "  CC ") || strings.HasPrefix(line, "  AS ") {
			compiled.Add(1)
		}
	}, name, margs...); err != nil {
		return nil, fmt.Errorf("kernel: compile: %w: %v", errdefs.ErrFailed, err)
	}

	inst := filepath.Join(tmp, "install")
	os.RemoveAll(inst) // left by an interrupted build
	mods := filepath.Join(inst, "lib", "modules", version)
	if err := os.MkdirAll(mods, 0o755); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	for _, c := range []struct{ from, to string }{
		{filepath.Join(out, "arch", "x86", "boot", "bzImage"), filepath.Join(inst, "vmlinuz")},
		{filepath.Join(out, "vmlinux"), filepath.Join(inst, "vmlinux")},
		{filepath.Join(out, ".config"), filepath.Join(inst, "config")},
		{filepath.Join(out, "modules.builtin"), filepath.Join(mods, "modules.builtin")},
	} {
		// Copied, not moved: make's next run in a kept work directory
		// relies on them.
		if err := copyFile(c.from, c.to); err != nil {
			return nil, fmt.Errorf("kernel: install: %w: %w", errdefs.ErrFailed, err)
		}
	}
	// No loadable modules: an empty modules.dep says so to the initramfs
	// builder, and modules.builtin tells it every driver it asks for is
	// built in.
	if err := os.WriteFile(filepath.Join(mods, "modules.dep"), nil, 0o644); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	sum := sha256.Sum256(Config)
	info := BuildInfo{Version: version, SourcePackage: SourcePackage, SourceVersion: sv,
		ConfigSHA256: hex.EncodeToString(sum[:]), Recipe: recipe,
		BuildSeconds: time.Since(start).Round(time.Second).Seconds(), Jobs: jobs}
	b, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(inst, ownMarker), append(b, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	dst := filepath.Join(cacheDir, version)
	if err := os.Rename(inst, dst); err != nil {
		if k, ok := load(cacheDir, version); ok {
			return k, nil // another smx built it meanwhile
		}
		return nil, fmt.Errorf("kernel: install %s: %w", dst, err)
	}
	k, ok := load(cacheDir, version)
	if !ok {
		return nil, fmt.Errorf("kernel: %s is incomplete after install: %w", dst, errdefs.ErrFailed)
	}
	fmt.Fprintf(progress, "kernel: %s built in %s, in %s\n", version, time.Since(start).Round(time.Second), dst)
	if opts.WorkDir == "" {
		os.RemoveAll(tmp)
	}
	return k, nil
}

// unpackSource downloads the source package at version sv into dir and
// unpacks its tarball there.
func unpackSource(ctx context.Context, dir, sv string, progress io.Writer) error {
	fmt.Fprintf(progress, "kernel: downloading %s %s\n", SourcePackage, sv)
	old, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	for _, f := range old {
		os.Remove(f)
	}
	args := []string{"download", SourcePackage + "=" + sv}
	if os.Geteuid() == 0 {
		args = append([]string{"-o", "APT::Sandbox::User=root"}, args...)
	}
	if _, err := run(ctx, dir, "apt-get", args...); err != nil {
		return fmt.Errorf("kernel: download %s: %w: check the apt sources, or run `apt-get update` (%v)", SourcePackage, errdefs.ErrUnavailable, err)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("kernel: download %s: got %d .deb files, want 1: %w", SourcePackage, len(debs), errdefs.ErrFailed)
	}
	fmt.Fprintf(progress, "kernel: unpacking the kernel source\n")
	os.RemoveAll(filepath.Join(dir, SourcePackage))
	tarball := "usr/src/" + SourcePackage + ".tar.xz"
	if err := shell(ctx, dir, `dpkg-deb --fsys-tarfile "$1" | tar -x "./$2" && tar -xJf "$2" && rm -rf "$1" usr`, debs[0], tarball); err != nil {
		return fmt.Errorf("kernel: unpack %s: %w: %v", filepath.Base(debs[0]), errdefs.ErrFailed, err)
	}
	return nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o644)
}

// ReadBuildInfo returns what Build recorded about an own kernel.
func ReadBuildInfo(k *Kernel) (*BuildInfo, error) {
	b, err := os.ReadFile(filepath.Join(k.Dir, ownMarker))
	if err != nil {
		return nil, fmt.Errorf("kernel: %s: %w", k.Version, err)
	}
	var info BuildInfo
	if err := json.Unmarshal(b, &info); err != nil {
		return nil, fmt.Errorf("kernel: %s: %w", k.Version, err)
	}
	return &info, nil
}

var configLineRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^(CONFIG_[A-Za-z0-9_]+)=(.*)$|^# (CONFIG_[A-Za-z0-9_]+) is not set$`)
})

// checkConfig fails when an option the fragment sets did not survive into
// the final configuration: Kconfig drops an option silently when its
// dependencies are off, and the guest would then miss a feature.
func checkConfig(fragment []byte, dotConfig string) error {
	final, err := os.ReadFile(dotConfig)
	if err != nil {
		return fmt.Errorf("kernel: configure: %w", err)
	}
	have := parseConfig(final)
	var bad []string
	for opt, want := range parseConfig(fragment) {
		if got := have[opt]; got != want {
			if got == "" {
				got = "n"
			}
			bad = append(bad, fmt.Sprintf("%s=%s (got %s)", opt, want, got))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("kernel: configure: the source does not take %s: %w: the options or their dependencies changed; update internal/kernel/config/smx.config", strings.Join(bad, ", "), errdefs.ErrFailed)
	}
	return nil
}

// parseConfig maps each option a config file sets to its value ("n" for
// "is not set").
func parseConfig(b []byte) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		g := configLineRE().FindStringSubmatch(strings.TrimSpace(l))
		switch {
		case g == nil:
		case g[1] != "":
			m[g[1]] = g[2]
		default:
			m[g[3]] = "n"
		}
	}
	return m
}

// sourceVersion asks apt for the candidate version of SourcePackage.
func sourceVersion(ctx context.Context) (string, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return "", fmt.Errorf("kernel: apt-cache not found: %w: smx builds its kernel from the Debian package %s", errdefs.ErrUnavailable, SourcePackage)
	}
	out, err := run(ctx, "", "apt-cache", "show", "--no-all-versions", SourcePackage)
	if err != nil {
		return "", fmt.Errorf("kernel: %s is unknown to apt: %w: run `apt-get update` (as root) (%v)", SourcePackage, errdefs.ErrNotFound, err)
	}
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "Version: "); ok && strings.TrimSpace(v) != "" {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("kernel: apt-cache shows no version of %s: %w: run `apt-get update`", SourcePackage, errdefs.ErrNotFound)
}

// runEnv runs a command with env, handing each line of its combined output
// to line (when not nil); on failure the error carries the last lines,
// which is where make and the compiler explain.
func runEnv(ctx context.Context, env []string, line func(string), name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	var tail []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			if line != nil {
				line(l)
			}
			tail = append(tail, l)
			if len(tail) > 8 {
				tail = tail[1:]
			}
		}
		io.Copy(io.Discard, pr)
	}()
	err := cmd.Run()
	pw.Close()
	<-done
	if err != nil {
		return fmt.Errorf("%s: %w:\n%s", name, err, strings.Join(tail, "\n"))
	}
	return nil
}

// shell runs a POSIX shell script with arguments $1... in dir.
func shell(ctx context.Context, dir, script string, args ...string) error {
	_, err := run(ctx, dir, "sh", append([]string{"-ec", script, "sh"}, args...)...)
	return err
}
