package sshgw

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func TestIssueUserCert(t *testing.T) {
	ca, err := LoadOrCreateCA(filepath.Join(t.TempDir(), UserCAFile), "smx-user-ca")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	uc, err := ca.IssueUserCert(CertOptions{User: "deploy", TTL: 5 * time.Minute, Sandbox: "sb", Profile: "sha256:ab", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	c := uc.Cert
	if c.CertType != ssh.UserCert || len(c.ValidPrincipals) != 1 || c.ValidPrincipals[0] != "deploy" ||
		c.ValidAfter != uint64(now.Add(-time.Minute).Unix()) || c.ValidBefore != uint64(now.Add(5*time.Minute).Unix()) ||
		c.KeyId != "smx sandbox=sb profile=sha256:ab user=deploy" || c.Extensions[ExtensionSandbox] != "sb sha256:ab" {
		t.Fatalf("certificate %+v", c)
	}
	for _, ext := range []string{"permit-port-forwarding", "permit-agent-forwarding", "permit-X11-forwarding", "permit-user-rc"} {
		if _, ok := c.Extensions[ext]; ok {
			t.Errorf("%s without the rule asking for it", ext)
		}
	}
	if len(c.CriticalOptions) != 0 {
		t.Errorf("critical options %v", c.CriticalOptions)
	}
	// It verifies against the CA, for that user only, within its window.
	checker := ssh.CertChecker{IsUserAuthority: func(k ssh.PublicKey) bool { return string(k.Marshal()) == string(ca.PublicKey().Marshal()) },
		Clock: func() time.Time { return now }}
	if err := checker.CheckCert("deploy", c); err != nil {
		t.Fatal(err)
	}
	if checker.CheckCert("root", c) == nil {
		t.Fatal("valid for another principal")
	}
	checker.Clock = func() time.Time { return now.Add(6 * time.Minute) }
	if checker.CheckCert("deploy", c) == nil {
		t.Fatal("valid after its TTL")
	}
	uc2, _ := ca.IssueUserCert(CertOptions{User: "deploy", TTL: time.Minute, Forward: []string{"local", "agent"}})
	if _, ok := uc2.Cert.Extensions["permit-port-forwarding"]; !ok {
		t.Error("forward: [local] without permit-port-forwarding")
	}
	if _, ok := uc2.Cert.Extensions["permit-agent-forwarding"]; !ok {
		t.Error("forward: [agent] without permit-agent-forwarding")
	}
	if uc2.Cert.Serial == c.Serial || string(uc2.Cert.Key.Marshal()) == string(c.Key.Marshal()) {
		t.Error("two certificates share a serial or a key")
	}
}

func TestCAFiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d", HostCAFile)
	a, err := LoadOrCreateCA(p, "c")
	if err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	b, err := LoadOrCreateCA(p, "c")
	if err != nil || b.Fingerprint() != a.Fingerprint() {
		t.Fatalf("reload: %v %v", err, b)
	}
	r, err := RotateCA(p, "c")
	if err != nil || r.Fingerprint() == a.Fingerprint() {
		t.Fatalf("rotate: %v", err)
	}
	if l, _ := LoadCA(p); l.Fingerprint() != r.Fingerprint() {
		t.Fatal("rotation not on disk")
	}
	pub, _ := os.ReadFile(p + ".pub")
	if string(pub) != r.AuthorizedKey()+" c\n" {
		t.Fatalf(".pub %q", pub)
	}
}

// Supervisors starting at once create the user CA once; none reads a
// half-written key.
func TestCAConcurrentCreate(t *testing.T) {
	for round := 0; round < 20; round++ {
		p := filepath.Join(t.TempDir(), UserCAFile)
		fps := make(chan string, 8)
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			go func() {
				ca, err := LoadOrCreateCA(p, "c")
				if err != nil {
					errs <- err
					return
				}
				fps <- ca.Fingerprint()
			}()
		}
		var first string
		for i := 0; i < 8; i++ {
			select {
			case err := <-errs:
				t.Fatal(err)
			case fp := <-fps:
				if first == "" {
					first = fp
				} else if fp != first {
					t.Fatalf("two CAs: %s and %s", first, fp)
				}
			}
		}
		if ents, _ := os.ReadDir(filepath.Dir(p)); len(ents) != 2 {
			t.Fatalf("left behind: %v", ents)
		}
	}
}
