package sshserve

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/crypto/ssh"
)

// Files names a sandbox's SSH key files, all in Dir (the sandbox's own
// directory in smx's state, which only the host can write).
type Files struct{ Dir string }

// ClientKey is the private key an editor's ssh client signs in with.
func (f Files) ClientKey() string { return filepath.Join(f.Dir, "ssh_client_ed25519") }

// HostKey is the private key the supervisor's SSH server proves itself
// with; it never enters the guest.
func (f Files) HostKey() string { return filepath.Join(f.Dir, "ssh_host_ed25519") }

// KnownHosts is the known_hosts file that pins HostKey's public half
// under alias.
func (f Files) KnownHosts() string { return filepath.Join(f.Dir, "ssh_known_hosts") }

// Keys are a sandbox's two key pairs.
type Keys struct {
	Host   ssh.Signer
	Client ssh.Signer
}

// Ensure returns the sandbox's keys, making each one that does not exist
// yet (0600, created whole or not at all, so two processes racing agree
// on one key).
func (f Files) Ensure() (*Keys, error) {
	host, err := ensureKey(f.HostKey())
	if err != nil {
		return nil, err
	}
	client, err := ensureKey(f.ClientKey())
	if err != nil {
		return nil, err
	}
	return &Keys{Host: host, Client: client}, nil
}

// Load returns the sandbox's keys; ones not yet made are
// errdefs-free fs.ErrNotExist.
func (f Files) Load() (*Keys, error) {
	host, err := loadKey(f.HostKey())
	if err != nil {
		return nil, err
	}
	client, err := loadKey(f.ClientKey())
	if err != nil {
		return nil, err
	}
	return &Keys{Host: host, Client: client}, nil
}

func loadKey(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := ssh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("sshserve: %s: %w", path, err)
	}
	return s, nil
}

func ensureKey(path string) (ssh.Signer, error) {
	if s, err := loadKey(path); !errors.Is(err, fs.ErrNotExist) {
		return s, err
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	blk, err := ssh.MarshalPrivateKey(priv, "smx "+filepath.Base(filepath.Dir(path)))
	if err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".key-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(pem.EncodeToMemory(blk)); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	// Link, not rename: a key another process made first wins, and both
	// then use it.
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, err
	}
	return loadKey(path)
}

// WriteKnownHosts writes the known_hosts file pinning k's host key under
// alias, replacing what was there.
func (f Files) WriteKnownHosts(alias string, k *Keys) error {
	line := alias + " " + string(ssh.MarshalAuthorizedKey(k.Host.PublicKey()))
	tmp := f.KnownHosts() + ".tmp"
	if err := os.WriteFile(tmp, []byte(line), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, f.KnownHosts())
}
