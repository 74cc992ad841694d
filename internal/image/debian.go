package image

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/smx-dev/smx/internal/errdefs"
)

const (
	debianSuite   = "bookworm"
	defaultMirror = "http://deb.debian.org/debian"
)

// debianBase is what every Debian image holds beyond minbase: what coding
// agents reach for first.
var debianBase = []string{"git", "curl", "ca-certificates", "openssh-client"}

// Debian package names: lower case alphanumerics and + - . (Debian policy
// 5.6.1). Checking them keeps odd strings away from debootstrap's command
// line.
var debPackageRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`) })

// BuildDebian builds a Debian bookworm image with debootstrap (minbase plus
// git, curl, ca-certificates, openssh-client and packages), with a `user`
// account (uid 1000). Packages come from the mirror the host's apt uses.
// debootstrap's output is streamed to progress; the build takes minutes.
// It needs root: debootstrap creates device nodes and chowns files, and
// runs the packages' maintainer scripts in a chroot.
func (s *Store) BuildDebian(ctx context.Context, name string, packages []string, progress io.Writer) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	include := slices.Clone(debianBase)
	for _, p := range packages {
		if !debPackageRE().MatchString(p) {
			return nil, fmt.Errorf("image: build %s: invalid Debian package name %q: %w", name, p, errdefs.ErrInvalid)
		}
		if !slices.Contains(include, p) {
			include = append(include, p)
		}
	}
	if !privileged() {
		return nil, fmt.Errorf("image: build %s: debootstrap needs root: run the build with sudo, or use --from busybox or import an OCI image: %w", name, errdefs.ErrUnavailable)
	}
	if err := checkTools("debootstrap", "chroot", "mkfs.ext4", "qemu-img"); err != nil {
		return nil, fmt.Errorf("image: build %s: %w", name, err)
	}
	b, err := s.begin(name, progress)
	if err != nil {
		return nil, err
	}
	defer b.abort()
	if err := b.debootstrap(ctx, include); err != nil {
		return nil, err
	}
	b.logf("configuring accounts and cleaning caches")
	if err := configureDebian(ctx, b.tree); err != nil {
		return nil, fmt.Errorf("image: build %s: configure: %w", name, err)
	}
	return b.finish(ctx, "debian:"+debianSuite+"+"+strings.Join(include, ","), largeSizing, nil)
}

// debootstrap installs Debian minbase plus include into the build's tree.
func (b *build) debootstrap(ctx context.Context, include []string) error {
	mirror := hostMirror()
	b.logf("debootstrap %s from %s (this takes a few minutes)", debianSuite, mirror)
	if err := runTool(ctx, b.progress, "debootstrap", "--variant=minbase",
		"--include="+strings.Join(include, ","), debianSuite, b.tree.dir, mirror); err != nil {
		return fmt.Errorf("image: build %s: debootstrap (output above): %w", b.name, err)
	}
	return nil
}

func configureDebian(ctx context.Context, t *tree) error {
	if err := runTool(ctx, nil, "chroot", t.dir, "useradd", "--uid", "1000", "--user-group",
		"--create-home", "--shell", "/bin/bash", "user"); err != nil {
		return err
	}
	// debootstrap copies the host's resolv.conf and hostname in; neither
	// belongs in a guest whose DNS is the smx gateway.
	for _, f := range []string{"etc/resolv.conf", "etc/hostname", "etc/hosts"} {
		if err := t.root.Remove(f); err != nil && !os.IsNotExist(err) {
			return err
		}
	}
	if err := t.writeString("etc/hostname", "smx\n", 0o644); err != nil {
		return err
	}
	if err := t.writeString("etc/hosts", hostsFile, 0o644); err != nil {
		return err
	}
	// Package caches and lists are a third of a minbase tree; an agent that
	// wants packages runs apt-get update anyway.
	for _, pattern := range []string{"var/cache/apt/archives/*.deb", "var/cache/apt/*.bin", "var/lib/apt/lists/*", "var/log/*.log", "var/log/apt/*"} {
		matches, err := filepath.Glob(filepath.Join(t.dir, pattern))
		if err != nil {
			return err
		}
		for _, m := range matches {
			if filepath.Base(m) == "lock" || filepath.Base(m) == "partial" {
				continue
			}
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	return ensureGuestDirs(t)
}

// hostMirror returns the Debian mirror the host's apt uses for bookworm, so
// builds go through the same (maybe local or proxied) mirror as the host.
func hostMirror() string {
	var files []string
	if _, err := os.Stat("/etc/apt/sources.list"); err == nil {
		files = append(files, "/etc/apt/sources.list")
	}
	for _, pat := range []string{"/etc/apt/sources.list.d/*.list", "/etc/apt/sources.list.d/*.sources"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var uri string
		if strings.HasSuffix(f, ".sources") {
			uri = mirrorFromDeb822(string(b), debianSuite)
		} else {
			uri = mirrorFromList(string(b), debianSuite)
		}
		if uri != "" {
			return uri
		}
	}
	return defaultMirror
}

func usableURI(u string) bool {
	return strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") || strings.HasPrefix(u, "file:/")
}

// mirrorFromList finds a "deb [options] URI SUITE COMPONENTS..." line for
// exactly suite (not suite-security or suite-updates, which are not full
// archives).
func mirrorFromList(content, suite string) string {
	sc := bufio.NewScanner(strings.NewReader(content))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) == 0 {
				continue
			}
			f = f[1:]
		}
		if len(f) >= 2 && f[1] == suite && usableURI(f[0]) {
			return strings.TrimSuffix(f[0], "/")
		}
	}
	return ""
}

// mirrorFromDeb822 does the same for the deb822 .sources format: stanzas of
// "Field: value" lines separated by blank lines.
func mirrorFromDeb822(content, suite string) string {
	for stanza := range strings.SplitSeq(strings.ReplaceAll(content, "\r\n", "\n"), "\n\n") {
		fields := map[string]string{}
		for line := range strings.SplitSeq(stanza, "\n") {
			if strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, ":")
			if ok && !strings.HasPrefix(k, " ") {
				fields[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
		if strings.EqualFold(fields["enabled"], "no") || !slices.Contains(strings.Fields(fields["types"]), "deb") ||
			!slices.Contains(strings.Fields(fields["suites"]), suite) {
			continue
		}
		for _, u := range strings.Fields(fields["uris"]) {
			if usableURI(u) {
				return strings.TrimSuffix(u, "/")
			}
		}
	}
	return ""
}
