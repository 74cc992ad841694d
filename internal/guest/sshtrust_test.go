package guest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInstallSSHCA(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, SSHKnownHosts)
	os.MkdirAll(filepath.Dir(p), 0o755)
	os.WriteFile(p, []byte("github.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"), 0o644)
	a := "@cert-authority * ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA smx-sandbox-a"
	b := "@cert-authority * ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB smx-sandbox-b"
	if err := InstallSSHCA(root, a); err != nil {
		t.Fatal(err)
	}
	// A fork installs its own CA: the source's line must go.
	if err := InstallSSHCA(root, b); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(p)
	s := string(got)
	if strings.Contains(s, "smx-sandbox-a") || strings.Count(s, "@cert-authority") != 1 || !strings.Contains(s, b) || !strings.HasPrefix(s, "github.com ") {
		t.Fatalf("known_hosts:\n%s", s)
	}
	for _, bad := range []string{
		"",
		"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", // not a CA line
		"@cert-authority github.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAA",  // not for *
		a + "\n* ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAAAAAAAAAAAAAAA",                     // a second line
		"@cert-authority * ssh-ed25519 !!!!notbase64!!!!!!!!!!",
	} {
		if err := InstallSSHCA(root, bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
