package kernel_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/testutil"
)

// TestOwnKernelGuest boots smx's own kernel with `smx run` (busybox image)
// and checks from inside the guest what the configuration promises and
// the stock kernel cannot give without modules: no module loading at all,
// user namespaces for an unprivileged user, overlayfs, seccomp filters,
// landlock as the LSM, cgroup v2 controllers, and the version the cache
// names it by.
func TestOwnKernelGuest(t *testing.T) {
	testutil.RequireQEMU(t)
	cache := testutil.KernelCache(t)
	own, err := kernel.Find(cache)
	testutil.Require(t, err == nil && own.Own, "smx's own kernel in "+cache, "run `smx kernel build` (scripts/test.sh does)")
	bin := testutil.Binaries(t)
	home := t.TempDir()
	testutil.AwaitSandboxesGone(t, bin, home)
	if err := os.MkdirAll(filepath.Join(home, "kernels"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(own.Dir, filepath.Join(home, "kernels", own.Version)); err != nil {
		t.Fatal(err)
	}
	smx := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(bin, "smx"), args...)
		cmd.Env = append(os.Environ(), "SMX_HOME="+home)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := smx("image", "build", "busybox", "--from", "busybox"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	script := `
set -e
echo "release $(cat /proc/sys/kernel/osrelease)"
test ! -e /proc/modules && echo "no-modules"
su -s /bin/sh user -c 'unshare -U -r -m -n -p -f --mount-proc id -u' | sed 's/^/userns /'
mkdir -p /tmp/o/l /tmp/o/u /tmp/o/w /tmp/o/m && echo x >/tmp/o/l/f
mount -t overlay overlay -o lowerdir=/tmp/o/l,upperdir=/tmp/o/u,workdir=/tmp/o/w /tmp/o/m
echo y >>/tmp/o/m/f && test "$(cat /tmp/o/l/f)" = x && echo "overlay $(cat /tmp/o/u/f | tr '\n' ' ')"
grep '^Seccomp_filters:' /proc/self/status
mount -t securityfs securityfs /sys/kernel/security
echo "lsm $(cat /sys/kernel/security/lsm)"
echo "cgroup $(cat /sys/fs/cgroup/cgroup.controllers)"
grep -w fuse /proc/filesystems
grep -w 9p /proc/filesystems
zcat /proc/config.gz | grep '^CONFIG_MODULES\|^# CONFIG_MODULES '
`
	out, err := smx("run", "--cold", "--", "sh", "-c", script)
	t.Logf("guest:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"release " + own.Version + "\n",
		"no-modules\n",
		"userns 0\n",
		"overlay x y \n",
		"Seccomp_filters:",
		"landlock\n",
		"fuse\n",
		"9p\n",
		"# CONFIG_MODULES is not set\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q", want)
		}
	}
	for _, c := range []string{"cpuset", "cpu", "io", "memory", "pids"} {
		if !strings.Contains(out, " "+c) && !strings.Contains(out, "cgroup "+c) {
			t.Errorf("cgroup controller %s missing", c)
		}
	}
}
