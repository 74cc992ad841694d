package image

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
)

// busyboxPath is where Debian's busybox-static installs the binary.
var busyboxPath = "/bin/busybox"

// BuildBusybox builds a small image from the host's static busybox: every
// applet as a symlink, root/nobody/user accounts, and the directories the
// guest agent needs. It takes a second or two and is meant for tests and
// quick sandboxes.
func (s *Store) BuildBusybox(ctx context.Context, name string, progress io.Writer) (*Image, error) {
	if err := checkTools("mkfs.ext4", "qemu-img"); err != nil {
		return nil, fmt.Errorf("image: build %s: %w", name, err)
	}
	if err := staticBusybox(); err != nil {
		return nil, fmt.Errorf("image: build %s: %w", name, err)
	}
	b, err := s.begin(name, progress)
	if err != nil {
		return nil, err
	}
	defer b.abort()
	b.logf("building busybox root")
	if err := busyboxRoot(ctx, b.tree); err != nil {
		return nil, fmt.Errorf("image: build %s: busybox root: %w", name, err)
	}
	return b.finish(ctx, "busybox", smallSizing, nil)
}

// Accounts of every built image: root, an unprivileged user for agents
// (uid 1000, matching the usual first desktop user so that shared folders
// line up), and nobody.
const (
	passwdFile = `root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
`
	groupFile = `root:x:0:
user:x:1000:
nogroup:x:65534:
`
	hostsFile = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
`
	profileFile = `export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PS1='\u@\h:\w\$ '
`
)

func busyboxRoot(ctx context.Context, t *tree) error {
	applets, err := busyboxApplets(ctx)
	if err != nil {
		return err
	}
	for _, d := range []string{"bin", "sbin", "usr/bin", "usr/sbin", "usr/local/bin",
		"etc", "etc/ssl/certs", "home", "mnt", "var", "proc", "sys", "dev", "run"} {
		if err := t.mkdir(d, 0o755, 0, 0); err != nil {
			return err
		}
	}
	for _, d := range []string{"tmp", "var/tmp"} {
		if err := t.mkdir(d, 0o777|fs.ModeSticky, 0, 0); err != nil {
			return err
		}
	}
	if err := t.mkdir("root", 0o700, 0, 0); err != nil {
		return err
	}
	if err := t.mkdir("home/user", 0o755, 1000, 1000); err != nil {
		return err
	}
	bb, err := os.Open(busyboxPath)
	if err != nil {
		return err
	}
	defer bb.Close()
	if err := t.writeFile("bin/busybox", bb, 0o755, 0, 0); err != nil {
		return err
	}
	if !slices.Contains(applets, "bin/sh") {
		applets = append(applets, "bin/sh")
	}
	for _, a := range applets {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := t.symlink("/bin/busybox", a, 0, 0); err != nil {
			return fmt.Errorf("applet %s: %w", a, err)
		}
	}
	for _, f := range []struct{ path, body string }{
		{"etc/passwd", passwdFile},
		{"etc/group", groupFile},
		{"etc/hostname", "smx\n"},
		{"etc/hosts", hostsFile},
		{"etc/profile", profileFile},
	} {
		if err := t.writeString(f.path, f.body, 0o644); err != nil {
			return err
		}
	}
	// The host's CA bundle lets TLS clients in the guest (curl, wget with
	// ssl_client) verify servers. It makes the digest host-dependent, which
	// is fine: the digest identifies the content, not the recipe.
	if ca, err := os.Open("/etc/ssl/certs/ca-certificates.crt"); err == nil {
		defer ca.Close()
		if err := t.writeFile("etc/ssl/certs/ca-certificates.crt", ca, 0o644, 0, 0); err != nil {
			return err
		}
	}
	return nil
}

func staticBusybox() error {
	f, err := elf.Open(busyboxPath)
	if err != nil {
		return fmt.Errorf("%s not usable (%v): install busybox-static (run `smx setup`): %w", busyboxPath, err, errdefs.ErrUnavailable)
	}
	defer f.Close()
	for _, p := range f.Progs {
		// A dynamic binary would need the host's libc inside the image.
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: install busybox-static (run `smx setup`): %w", busyboxPath, errdefs.ErrUnavailable)
		}
	}
	return nil
}

func busyboxApplets(ctx context.Context) ([]string, error) {
	out, err := exec.CommandContext(ctx, busyboxPath, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	var list []string
	for l := range strings.SplitSeq(string(bytes.TrimSpace(out)), "\n") {
		l = path.Clean(strings.TrimPrefix(strings.TrimSpace(l), "/"))
		if l == "." || strings.HasPrefix(l, "..") || l == "bin/busybox" {
			continue
		}
		list = append(list, l)
	}
	return list, nil
}
