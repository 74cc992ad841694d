package audit

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/statedir"
)

// KeyName is the note key name checkpoints are signed under.
const KeyName = "smx-audit"

// Key is the host's checkpoint signing key: an ed25519 note key kept in
// DIR/key (0600, the note signer key text) with its public half in
// DIR/key.pub.
type Key struct {
	signer   note.Signer
	verifier note.Verifier
	public   string
	created  bool // this call created the key
}

// Signer signs checkpoints.
func (k *Key) Signer() note.Signer { return k.signer }

// Verifier checks checkpoints.
func (k *Key) Verifier() note.Verifier { return k.verifier }

// PublicKey is the note verifier key text ("smx-audit+hash+base64"), what
// `smx agent logs --key` prints. Kept somewhere the host's state directory
// cannot reach, it lets a user verify logs against a key an intruder on the
// host could not have swapped.
func (k *Key) PublicKey() string { return k.public }

// LoadOrCreateKey loads the key in dir, creating dir (0700) and a fresh key
// when there is none. Two processes racing to create it end up with the same
// key: the private key file is claimed with a hard link, which fails if it
// exists.
func LoadOrCreateKey(dir string) (*Key, error) {
	path := filepath.Join(dir, "key")
	k, err := loadKey(path)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return k, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: key: %w", err)
	}
	skey, vkey, err := note.GenerateKey(rand.Reader, KeyName)
	if err != nil {
		return nil, fmt.Errorf("audit: key: generate: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".key-*")
	if err != nil {
		return nil, fmt.Errorf("audit: key: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(skey + "\n")
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("audit: key: write: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("audit: key: %w", err)
	}
	statedir.SyncDir(dir)
	k, err = loadKey(path)
	if err != nil {
		return nil, err
	}
	if k.public == vkey { // we won any race: publish the public half
		_ = statedir.WriteFileAtomic(filepath.Join(dir, "key.pub"), []byte(vkey+"\n"), 0o644)
		k.created = true
	}
	return k, nil
}

func loadKey(path string) (*Key, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("audit: key: %w", err)
	}
	skey := strings.TrimSpace(string(b))
	signer, err := note.NewSigner(skey)
	if err != nil {
		return nil, fmt.Errorf("audit: key: %s is not a note signer key: %v: %w", path, err, errdefs.ErrInvalid)
	}
	// Signer key text: PRIVATE+KEY+name+hash+base64(0x01 || seed).
	parts := strings.SplitN(skey, "+", 5) // base64 may contain '+'; the name may not
	raw, err := base64.StdEncoding.DecodeString(parts[len(parts)-1])
	if err != nil || len(raw) != 1+ed25519.SeedSize || raw[0] != 1 {
		return nil, fmt.Errorf("audit: key: %s is not an ed25519 key: %w", path, errdefs.ErrInvalid)
	}
	pub := ed25519.NewKeyFromSeed(raw[1:]).Public().(ed25519.PublicKey)
	vkey, err := note.NewEd25519VerifierKey(signer.Name(), pub)
	if err != nil {
		return nil, fmt.Errorf("audit: key: %w", err)
	}
	verifier, err := note.NewVerifier(vkey)
	if err != nil {
		return nil, fmt.Errorf("audit: key: %w", err)
	}
	return &Key{signer: signer, verifier: verifier, public: vkey}, nil
}

// ParseVerifier parses a verifier key as printed by PublicKey.
func ParseVerifier(vkey string) (note.Verifier, error) {
	v, err := note.NewVerifier(strings.TrimSpace(vkey))
	if err != nil {
		return nil, fmt.Errorf("audit: public key %q: %v: %w", vkey, err, errdefs.ErrInvalid)
	}
	return v, nil
}
