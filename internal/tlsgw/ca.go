// Package tlsgw is a sandbox's own certificate authority, which the network
// gateway uses to terminate the guest's TLS for destinations whose
// credential it injects (credential brokering).
//
// Each sandbox has its own CA (ECDSA P-256). Its key stays on the host in
// the sandbox directory (ca.key, 0600) and never enters the guest; only the
// certificate (ca.crt) is installed in the guest's trust store. A fork of a
// snapshot is a new sandbox directory and so gets a new CA: one sandbox's
// key can never mint certificates another sandbox trusts.
//
// Leaf certificates are issued on demand for the names the gateway has
// already allowed, and cached until shortly before they expire. A CA is
// safe for concurrent use.
package tlsgw

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// File names in the directory LoadOrCreate is given.
const (
	CertFile = "ca.crt"
	KeyFile  = "ca.key"
)

const (
	caLifetime   = 10 * 365 * 24 * time.Hour
	leafLifetime = 7 * 24 * time.Hour
	leafRenew    = 24 * time.Hour // a cached leaf closer than this to expiry is reissued
	maxLeaves    = 1024           // cache bound; a full cache is emptied
)

// CA issues leaf certificates for the credential broker.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// New makes a fresh CA in memory; name goes into its subject.
func New(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlsgw: key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{Organization: []string{"smx"}, CommonName: "smx sandbox CA " + name},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("tlsgw: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		leaves: map[string]*tls.Certificate{}}, nil
}

// LoadOrCreate loads the CA kept in dir (CertFile and KeyFile), or makes
// one and writes it there: the key 0600, the certificate 0644.
func LoadOrCreate(dir, name string) (*CA, error) {
	certPEM, cerr := os.ReadFile(filepath.Join(dir, CertFile))
	keyPEM, kerr := os.ReadFile(filepath.Join(dir, KeyFile))
	if cerr == nil && kerr == nil {
		return parse(certPEM, keyPEM)
	}
	if !errors.Is(cerr, os.ErrNotExist) && cerr != nil {
		return nil, fmt.Errorf("tlsgw: %w", cerr)
	}
	if !errors.Is(kerr, os.ErrNotExist) && kerr != nil {
		return nil, fmt.Errorf("tlsgw: %w", kerr)
	}
	ca, err := New(name)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(ca.key)
	if err != nil {
		return nil, fmt.Errorf("tlsgw: %w", err)
	}
	// Key first: a certificate without its key is useless, and the pair is
	// only read back when both exist.
	if err := writeFile(filepath.Join(dir, KeyFile), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, CertFile), ca.certPEM, 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

func parse(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("tlsgw: CA files are not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tlsgw: CA certificate: %w", err)
	}
	key, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("tlsgw: CA key: %w", err)
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("tlsgw: CA key does not match its certificate")
	}
	return &CA{cert: cert, key: key, certPEM: pem.EncodeToMemory(cb), leaves: map[string]*tls.Certificate{}}, nil
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return fmt.Errorf("tlsgw: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("tlsgw: %w", err)
	}
	return nil
}

// CertPEM is the CA certificate, PEM encoded: public, for the guest's
// trust store.
func (c *CA) CertPEM() []byte { return c.certPEM }

// Cert is the CA certificate.
func (c *CA) Cert() *x509.Certificate { return c.cert }

// Leaf returns a certificate for name (a DNS name or an IP address),
// chained to the CA, from the cache when it is not about to expire.
func (c *CA) Leaf(name string) (*tls.Certificate, error) {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == "" {
		return nil, errors.New("tlsgw: leaf: no name")
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaves[name]; ok && now.Add(leafRenew).Before(l.Leaf.NotAfter) {
		return l, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tlsgw: leaf key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{Organization: []string{"smx"}, CommonName: name},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("tlsgw: leaf %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if len(c.leaves) >= maxLeaves {
		clear(c.leaves)
	}
	l := &tls.Certificate{Certificate: [][]byte{der, c.cert.Raw}, PrivateKey: key, Leaf: leaf}
	c.leaves[name] = l
	return l, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return n
}
