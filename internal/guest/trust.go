package guest

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/smx-dev/smx/internal/agentproto"
)

// The sandbox CA in the guest's trust store. The host's gateway signs the
// certificates of brokered destinations with it (see internal/tlsgw); only
// the certificate comes here, never the key.
const (
	// CABundle is the bundle OpenSSL, curl, Go, Python (certifi aside)
	// and Node read on Debian-family systems; created if missing.
	CABundle = "/etc/ssl/certs/ca-certificates.crt"
	// CAFile is where update-ca-certificates looks, so a later run of it
	// in the guest keeps the CA in the bundle.
	CAFile = "/usr/local/share/ca-certificates/smx.crt"
)

// otherBundles are updated when they exist (other distributions' bundles).
var otherBundles = []string{"/etc/ssl/cert.pem", "/etc/pki/tls/certs/ca-bundle.crt"}

const (
	caBegin = "# smx sandbox CA (replaced at every boot and restore)\n"
	caEnd   = "# end smx sandbox CA\n"
)

func installCA(w io.Writer, certPEM []byte) error {
	if err := InstallCA("/", certPEM); err != nil {
		return err
	}
	return agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true})
}

// InstallCA puts certPEM (one CA certificate) into the trust store under
// root, replacing a CA an earlier install put there: a restored fork has
// its own CA and must stop trusting its source's.
func InstallCA(root string, certPEM []byte) error {
	b, rest := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" || len(bytes.TrimSpace(rest)) != 0 {
		return errors.New("guest: install-ca: want one PEM certificate")
	}
	cert, err := x509.ParseCertificate(b.Bytes)
	if err != nil || !cert.IsCA {
		return fmt.Errorf("guest: install-ca: not a CA certificate: %v", err)
	}
	clean := pem.EncodeToMemory(b)
	if err := writeAtomic(filepath.Join(root, CAFile), clean); err != nil {
		return err
	}
	paths := []string{filepath.Join(root, CABundle)}
	for _, p := range otherBundles {
		if st, err := os.Stat(filepath.Join(root, p)); err == nil && st.Mode().IsRegular() {
			paths = append(paths, filepath.Join(root, p))
		}
	}
	done := map[string]bool{}
	for _, p := range paths {
		// Write through symlinks (bundles are often links to one file).
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		if done[p] {
			continue
		}
		done[p] = true
		old, err := os.ReadFile(p)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("guest: install-ca: %w", err)
		}
		if err := writeAtomic(p, replaceBlock(old, clean, caBegin, caEnd)); err != nil {
			return err
		}
	}
	return nil
}

func writeAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("guest: install-ca: %w", err)
	}
	tmp := path + ".smx-tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("guest: install-ca: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("guest: install-ca: %w", err)
	}
	return nil
}
