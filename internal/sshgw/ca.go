package sshgw

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/statedir"
)

// CA is an SSH certificate authority whose key lives in one file on the
// host (OpenSSH private key format, 0600) with its public key beside it
// (FILE.pub). Two are used: the smx user CA (one per state directory,
// UserCAFile), which signs the short-lived certificates the gateway logs in
// upstream with, and each sandbox's host CA (HostCAFile in the sandbox
// directory), which signs the host certificates the guest's ssh checks.
// A CA is immutable; rotation writes a new file.
type CA struct {
	signer ssh.Signer
	path   string
}

// File names.
const (
	// UserCAFile is the smx SSH user CA, under the state directory.
	UserCAFile = "ssh/user_ca"
	// HostCAFile is a sandbox's SSH host CA, in its sandbox directory.
	HostCAFile = "ssh_host_ca"
)

// LoadOrCreateCA reads the CA at path, creating it (ed25519) when there is
// none. comment names it in the public key line.
func LoadOrCreateCA(path, comment string) (*CA, error) {
	ca, err := LoadCA(path)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return ca, err
	}
	return createCA(path, comment, false)
}

// RotateCA replaces the CA at path with a new key and returns it. Targets
// that trusted the old key must be told the new one (smx ssh-ca show).
func RotateCA(path, comment string) (*CA, error) { return createCA(path, comment, true) }

// LoadCA reads the CA at path.
func LoadCA(path string) (*CA, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sshgw: CA: %w", err)
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("sshgw: CA %s: %w", path, err)
	}
	return &CA{signer: s, path: path}, nil
}

func createCA(path, comment string, replace bool) (*CA, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("sshgw: CA: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sshgw: CA key: %w", err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, fmt.Errorf("sshgw: CA key: %w", err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sshgw: CA key: %w", err)
	}
	pub := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey()))) + " " + comment + "\n"
	if replace {
		if err := statedir.WriteFileAtomic(path, pem.EncodeToMemory(blk), 0o600); err != nil {
			return nil, fmt.Errorf("sshgw: CA: %w", err)
		}
	} else {
		// Two processes creating the CA at once must end with one, and a
		// reader must never see a half-written key: write a temporary
		// file, then link it into place, which fails if another won.
		tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
		if err != nil {
			return nil, fmt.Errorf("sshgw: CA: %w", err)
		}
		defer os.Remove(tmp.Name())
		_, werr := tmp.Write(pem.EncodeToMemory(blk))
		serr := tmp.Sync()
		if cerr := tmp.Close(); werr == nil && serr == nil && cerr != nil {
			werr = cerr
		}
		if werr != nil || serr != nil {
			return nil, fmt.Errorf("sshgw: CA: %w", errors.Join(werr, serr))
		}
		if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
			return LoadCA(path)
		} else if err != nil {
			return nil, fmt.Errorf("sshgw: CA: %w", err)
		}
	}
	if err := statedir.WriteFileAtomic(path+".pub", []byte(pub), 0o644); err != nil {
		return nil, fmt.Errorf("sshgw: CA: %w", err)
	}
	return &CA{signer: s, path: path}, nil
}

// PublicKey is the CA's public key.
func (c *CA) PublicKey() ssh.PublicKey { return c.signer.PublicKey() }

// AuthorizedKey is the CA's public key as one authorized_keys line
// ("ssh-ed25519 AAAA..."), without a newline.
func (c *CA) AuthorizedKey() string {
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(c.signer.PublicKey())))
}

// Fingerprint is the CA key's SHA256 fingerprint.
func (c *CA) Fingerprint() string { return ssh.FingerprintSHA256(c.signer.PublicKey()) }

// KnownHostsLine is the line that makes OpenSSH trust every host
// certificate the CA signs: what smx-agent writes into the guest's
// /etc/ssh/ssh_known_hosts.
func (c *CA) KnownHostsLine(comment string) string {
	return "@cert-authority * " + c.AuthorizedKey() + " " + comment
}

// sign signs a certificate for pub. Serial numbers are random, so two
// certificates are never confused in sshd's log.
func (c *CA) sign(pub ssh.PublicKey, typ uint32, keyID string, principals []string, after, before time.Time, perms ssh.Permissions) (*ssh.Certificate, error) {
	var serial [8]byte
	rand.Read(serial[:])
	cert := &ssh.Certificate{
		Key:             pub,
		Serial:          binary.BigEndian.Uint64(serial[:]),
		CertType:        typ,
		KeyId:           keyID,
		ValidPrincipals: principals,
		ValidAfter:      uint64(after.Unix()),
		ValidBefore:     uint64(before.Unix()),
		Permissions:     perms,
	}
	if err := cert.SignCert(rand.Reader, c.signer); err != nil {
		return nil, fmt.Errorf("sshgw: sign: %w", err)
	}
	return cert, nil
}

// UserCert is what the gateway logs in upstream with.
type UserCert struct {
	Signer ssh.Signer // the certificate with its (ephemeral) private key
	Cert   *ssh.Certificate
}

// CertOptions describe one upstream login certificate.
type CertOptions struct {
	User    string        // the only principal
	TTL     time.Duration // validity from now (ssh.cert_ttl)
	Sandbox string        // in the key ID and the smx extension
	Profile string        // profile hash, likewise
	Forward []string      // policy.Forward* kinds that get their permit-* extension
	// Now is the issue time; zero means time.Now(). ValidAfter is a
	// minute earlier, for clock skew between host and target.
	Now time.Time
}

// ExtensionSandbox is the certificate extension naming the sandbox and its
// profile hash ("NAME PROFILE-HASH"); sshd ignores it, its log and an
// AuthorizedPrincipalsCommand can read it.
const ExtensionSandbox = "sandbox@smx"

// IssueUserCert signs a certificate for a new ephemeral key: principal
// o.User, valid for o.TTL, pty allowed, forwarding only as o.Forward
// lists it.
func (c *CA) IssueUserCert(o CertOptions) (*UserCert, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sshgw: key: %w", err)
	}
	key, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sshgw: key: %w", err)
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	ext := map[string]string{"permit-pty": "", ExtensionSandbox: o.Sandbox + " " + o.Profile}
	for _, f := range o.Forward {
		switch f {
		case "local", "remote":
			ext["permit-port-forwarding"] = ""
		case "agent":
			ext["permit-agent-forwarding"] = ""
		case "x11":
			ext["permit-X11-forwarding"] = ""
		}
	}
	keyID := "smx sandbox=" + o.Sandbox + " profile=" + o.Profile + " user=" + o.User
	cert, err := c.sign(key.PublicKey(), ssh.UserCert, keyID, []string{o.User}, now.Add(-time.Minute), now.Add(o.TTL),
		ssh.Permissions{Extensions: ext})
	if err != nil {
		return nil, err
	}
	s, err := ssh.NewCertSigner(cert, key)
	if err != nil {
		return nil, fmt.Errorf("sshgw: cert signer: %w", err)
	}
	return &UserCert{Signer: s, Cert: cert}, nil
}

// hostCert signs a host certificate for key, valid for the names the
// guest may have typed.
func (c *CA) hostCert(key ssh.Signer, names []string, now time.Time) (ssh.Signer, error) {
	cert, err := c.sign(key.PublicKey(), ssh.HostCert, "smx gateway "+strings.Join(names, ","), names,
		now.Add(-5*time.Minute), now.Add(24*time.Hour), ssh.Permissions{})
	if err != nil {
		return nil, err
	}
	return ssh.NewCertSigner(cert, key)
}
