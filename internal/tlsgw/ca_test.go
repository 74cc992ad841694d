package tlsgw

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
)

func TestLoadOrCreate(t *testing.T) {
	dir := t.TempDir()
	ca, err := LoadOrCreate(dir, "box")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v", st, err)
	}
	again, err := LoadOrCreate(dir, "box")
	if err != nil || !bytes.Equal(again.CertPEM(), ca.CertPEM()) {
		t.Fatalf("reload: %v, same=%v", err, bytes.Equal(again.CertPEM(), ca.CertPEM()))
	}
	other, _ := LoadOrCreate(t.TempDir(), "fork")
	if bytes.Equal(other.CertPEM(), ca.CertPEM()) {
		t.Fatal("two directories share a CA")
	}
	if bytes.Contains(ca.CertPEM(), []byte("PRIVATE")) {
		t.Fatal("CertPEM holds a key")
	}

	leaf, err := again.Leaf("API.Example.com.")
	if err != nil {
		t.Fatal(err)
	}
	if l2, _ := again.Leaf("api.example.com"); l2 != leaf {
		t.Error("leaf not cached")
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: roots}); err != nil {
		t.Errorf("leaf does not verify against the CA: %v", err)
	}
	otherRoots := x509.NewCertPool()
	otherRoots.AppendCertsFromPEM(other.CertPEM())
	if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: otherRoots}); err == nil {
		t.Error("leaf verifies against another sandbox's CA")
	}

	// A key that does not match the certificate is refused.
	os.WriteFile(filepath.Join(dir, CertFile), other.CertPEM(), 0o644)
	if _, err := LoadOrCreate(dir, "box"); err == nil {
		t.Error("mismatched key and certificate loaded")
	}
}
