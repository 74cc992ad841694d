package guest

import (
	"bytes"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/tlsgw"
)

func TestInstallCA(t *testing.T) {
	root := t.TempDir()
	bundle := filepath.Join(root, CABundle)
	os.MkdirAll(filepath.Dir(bundle), 0o755)
	public, _ := tlsgw.New("public")
	os.WriteFile(bundle, public.CertPEM(), 0o644)

	first, _ := tlsgw.New("first")
	second, _ := tlsgw.New("second")
	for _, ca := range []*tlsgw.CA{first, second, second} {
		if err := InstallCA(root, ca.CertPEM()); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(bundle)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatal("bundle does not parse")
	}
	if !bytes.Contains(b, public.CertPEM()) || !bytes.Contains(b, second.CertPEM()) || bytes.Contains(b, first.CertPEM()) {
		t.Errorf("bundle should hold the public CA and only the newest sandbox CA:\n%s", b)
	}
	if n := strings.Count(string(b), caBegin); n != 1 {
		t.Errorf("%d smx blocks", n)
	}
	if f, _ := os.ReadFile(filepath.Join(root, CAFile)); !bytes.Equal(f, second.CertPEM()) {
		t.Errorf("%s = %s", CAFile, f)
	}

	// A guest without a bundle gets one; junk is refused.
	empty := t.TempDir()
	if err := InstallCA(empty, second.CertPEM()); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(empty, CABundle)); !bytes.Contains(b, second.CertPEM()) {
		t.Errorf("new bundle = %s", b)
	}
	for _, bad := range [][]byte{nil, []byte("junk"), append(second.CertPEM(), second.CertPEM()...)} {
		if err := InstallCA(empty, bad); err == nil {
			t.Errorf("InstallCA(%q) succeeded", bad)
		}
	}
}
