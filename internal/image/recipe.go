package image

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Recipe is what BuildRecipe puts on top of Debian bookworm minbase.
type Recipe struct {
	Apt []string // Debian packages, installed with apt-get in the image's chroot
	Npm []string // npm packages, NAME@VERSION, installed globally under /usr/local
}

// BuildRecipe builds an image from a recipe: debootstrap (minbase plus the
// Debian image's base packages), then the recipe's Debian packages with
// apt-get in the image's chroot (debootstrap's own resolver gives up on
// large dependency trees such as Debian's npm), then the npm packages.
//
// npm packages are fetched by the host's npm with --ignore-scripts into the
// tree's /usr/local (npm takes the guest's platform: linux, x64, glibc, so
// a platform optional dependency such as Claude Code's native binary comes
// with it), and then the top-level packages' own install scripts run in the
// image's chroot with the image's node: no package code ever runs on the
// host. Dependencies' install scripts are not run (the agents' packages
// ship prebuilt binaries). source is recorded as the image's Source.
//
// It needs root (debootstrap, chroot) and the host's npm when the recipe
// lists npm packages.
func (s *Store) BuildRecipe(ctx context.Context, name, source string, r Recipe, progress io.Writer) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	for _, p := range r.Apt {
		if !debPackageRE().MatchString(p) {
			return nil, fmt.Errorf("image: build %s: invalid Debian package name %q: %w", name, p, errdefs.ErrInvalid)
		}
	}
	if !privileged() {
		return nil, fmt.Errorf("image: build %s: building a preset's image needs root (debootstrap): run it once with sudo, e.g. `sudo smx agent run ...`, or build it with `sudo smx image build`: %w", name, errdefs.ErrUnavailable)
	}
	if err := checkTools("debootstrap", "chroot", "mkfs.ext4", "qemu-img"); err != nil {
		return nil, fmt.Errorf("image: build %s: %w", name, err)
	}
	npm := ""
	if len(r.Npm) > 0 {
		var err error
		if npm, err = exec.LookPath("npm"); err != nil {
			return nil, fmt.Errorf("image: build %s: npm not found: the host's npm fetches the image's npm packages (their scripts run in the image): install it (apt-get install npm): %w", name, errdefs.ErrUnavailable)
		}
	}
	b, err := s.begin(name, progress)
	if err != nil {
		return nil, err
	}
	defer b.abort()
	start := time.Now()
	if err := b.debootstrap(ctx, slices.Clone(debianBase)); err != nil {
		return nil, err
	}
	root := b.tree.dir
	if len(r.Apt) > 0 {
		unmount, err := mountChrootFS(root)
		if err != nil {
			return nil, fmt.Errorf("image: build %s: %w", name, err)
		}
		b.logf("apt-get install %s", strings.Join(r.Apt, " "))
		aptEnv := []string{"DEBIAN_FRONTEND=noninteractive", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C"}
		err = runChroot(ctx, b.progress, root, aptEnv, "apt-get", "-q", "update")
		if err == nil {
			args := append([]string{"-q", "-y", "--no-install-recommends", "install"}, r.Apt...)
			err = runChroot(ctx, b.progress, root, aptEnv, "apt-get", args...)
		}
		if uerr := unmount(); err == nil {
			err = uerr
		}
		if err != nil {
			return nil, fmt.Errorf("image: build %s: apt-get in the image (output above): %w", name, err)
		}
	}
	if len(r.Npm) > 0 {
		b.logf("npm install %s (fetched by the host's npm, scripts off)", strings.Join(r.Npm, " "))
		args := []string{"install", "--global", "--prefix", filepath.Join(root, "usr/local"),
			"--ignore-scripts", "--no-audit", "--no-fund", "--no-update-notifier",
			"--os", "linux", "--cpu", "x64", "--libc", "glibc"}
		args = append(args, r.Npm...)
		cmd := exec.CommandContext(ctx, npm, args...)
		cmd.Stdout, cmd.Stderr = b.progress, b.progress
		cmd.Env = append(os.Environ(), "npm_config_loglevel=warn")
		if err := cmd.Run(); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("image: build %s: npm install (output above): %w", name, err)
		}
		unmount, err := mountChrootFS(root)
		if err != nil {
			return nil, fmt.Errorf("image: build %s: %w", name, err)
		}
		for _, p := range r.Npm {
			if err = b.npmScripts(ctx, p); err != nil {
				break
			}
		}
		if uerr := unmount(); err == nil {
			err = uerr
		}
		if err != nil {
			return nil, fmt.Errorf("image: build %s: %w", name, err)
		}
	}
	b.logf("configuring accounts and cleaning caches")
	if err := configureDebian(ctx, b.tree); err != nil {
		return nil, fmt.Errorf("image: build %s: configure: %w", name, err)
	}
	im, err := b.finish(ctx, source, largeSizing, nil)
	if err == nil {
		fmt.Fprintf(b.progress, "image: %s built in %s\n", name, time.Since(start).Round(time.Second))
	}
	return im, err
}

// npmScripts runs a top-level npm package's install scripts in the image's
// chroot, as npm would after unpacking it.
func (b *build) npmScripts(ctx context.Context, spec string) error {
	at := strings.LastIndex(spec, "@")
	pkg := spec[:at]
	dir := filepath.Join("/usr/local/lib/node_modules", pkg)
	raw, err := os.ReadFile(filepath.Join(b.tree.dir, dir, "package.json"))
	if err != nil {
		return fmt.Errorf("npm package %s: %w", pkg, err)
	}
	var meta struct {
		Scripts map[string]string `json:"scripts"`
	}
	if err := json.Unmarshal(raw, &meta); err != nil {
		return fmt.Errorf("npm package %s: package.json: %w", pkg, err)
	}
	for _, stage := range []string{"preinstall", "install", "postinstall"} {
		script := meta.Scripts[stage]
		if script == "" {
			continue
		}
		b.logf("%s %s (in the image): %s", pkg, stage, script)
		env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/root", "LC_ALL=C",
			"npm_lifecycle_event=" + stage, "npm_package_name=" + pkg, "npm_config_global=true",
			"npm_config_prefix=/usr/local"}
		if err := runChroot(ctx, b.progress, b.tree.dir, env, "/bin/sh", "-c", "cd '"+dir+"' && "+script); err != nil {
			return fmt.Errorf("npm package %s: %s script (output above): %w", pkg, stage, err)
		}
	}
	return nil
}

// runChroot runs a command in the image's chroot with exactly env.
func runChroot(ctx context.Context, progress io.Writer, root string, env []string, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, "chroot", append([]string{root, name}, args...)...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = progress, progress
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	return nil
}

// mountChrootFS mounts /proc in the tree for package scripts that read it;
// the returned function unmounts it (lazily, so a stray process cannot keep
// the tree from being packed).
func mountChrootFS(root string) (func() error, error) {
	proc := filepath.Join(root, "proc")
	if err := os.MkdirAll(proc, 0o555); err != nil {
		return nil, err
	}
	if err := syscall.Mount("proc", proc, "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("mount proc in the image tree: %w", err)
	}
	return func() error {
		if err := syscall.Unmount(proc, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount %s: %w", proc, err)
		}
		return nil
	}, nil
}
