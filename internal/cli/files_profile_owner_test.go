package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestProfileMountOwner: a profile's files.mounts entry with uid/gid maps
// ownership as -v HOST:GUEST:uid=N,gid=N does: the host user's files show
// as N's in the guest (one mount in each spelling), one without stays
// root's, and what the guest writes belongs to the host user on the host.
func TestProfileMountOwner(t *testing.T) {
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	for _, d := range []string{a, b, c} {
		if err := os.WriteFile(filepath.Join(d, "f"), []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	prof := writeProfile(t, "files:\n  mounts:\n    - "+a+":/data/a:uid=1000,gid=1001\n    - host: "+b+"\n      guest: /data/b\n      uid: 2000\n      gid: 2000\n    - "+c+":/data/c\n  rules:\n    - path: /data/**\n      access: rw\n")
	v := startSandbox(t, "prof-owner", "--profile", prof)
	out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", "stat -c 'owner %n %u:%g' /data/a/f /data/b/f /data/c/f; echo new > /data/b/g && echo WROTE")
	if err != nil {
		t.Fatalf("exec: %v\n%s", err, out)
	}
	for _, want := range []string{"owner /data/a/f 1000:1001", "owner /data/b/f 2000:2000", "owner /data/c/f 0:0", "WROTE"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	st, err := os.Stat(filepath.Join(b, "g"))
	if err != nil {
		t.Fatal(err)
	}
	if sys := st.Sys().(*syscall.Stat_t); int(sys.Uid) != os.Getuid() || int(sys.Gid) != os.Getgid() {
		t.Errorf("the guest's file belongs to %d:%d on the host, want the host user %d:%d", sys.Uid, sys.Gid, os.Getuid(), os.Getgid())
	}
}
