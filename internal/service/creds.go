package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/preset"
)

// Credential is a secret in the host-side store as every caller sees it:
// its name and fingerprint, and which agent presets send it, never its
// value (no method of the service returns one).
type Credential struct {
	Name    string    `json:"name"`
	Bytes   int       `json:"bytes"`
	SHA256  string    `json:"sha256_prefix"` // first 8 hex digits of the value's SHA-256
	Updated time.Time `json:"updated"`
	// Presets are the agent presets whose model credential this is.
	Presets []string `json:"presets,omitempty"`
	// SignIn: the value is an imported subscription sign-in the host
	// refreshes (`smx creds login --import`), not a key.
	SignIn bool `json:"sign_in,omitempty"`
}

func (s *Service) creds() creds.Store { return creds.Store{Dir: s.state.Creds()} }

// SetCredential stores value under name, replacing any previous value. A
// trailing newline (from `echo` or a file) is never part of a token and is
// dropped.
func (s *Service) SetCredential(ctx context.Context, name string, value []byte) (*Credential, error) {
	value = []byte(strings.TrimRight(string(value), "\r\n"))
	if err := creds.ValidName(name); err != nil {
		return nil, err
	}
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	if err := s.creds().Set(name, value); err != nil {
		return nil, err
	}
	return s.credential(name)
}

// credential is one entry of ListCredentials.
func (s *Service) credential(name string) (*Credential, error) {
	list, err := s.ListCredentials(context.Background())
	if err != nil {
		return nil, err
	}
	for _, c := range list {
		if c.Name == name {
			return &c, nil
		}
	}
	return nil, fmt.Errorf("no such credential %s: %w", name, errdefs.ErrNotFound)
}

// ListCredentials lists the stored secrets by name, sorted, with the
// presets that send each; values are never read into the answer.
func (s *Service) ListCredentials(ctx context.Context) ([]Credential, error) {
	list, err := s.creds().List()
	if err != nil {
		return nil, err
	}
	users := presetsBySecret()
	names := map[string]bool{}
	for _, c := range list {
		names[c.Name] = true
	}
	out := []Credential{}
	for _, c := range list {
		// A sign-in is the access token under NAME and its refresh
		// material under NAME.oauth.
		base, refresh := strings.CutSuffix(c.Name, ".oauth")
		out = append(out, Credential{Name: c.Name, Bytes: c.Bytes, SHA256: c.SHA256Prefix, Updated: c.Updated,
			Presets: users[base], SignIn: refresh || names[c.Name+".oauth"]})
	}
	return out, nil
}

// presetsBySecret maps a secret's name to the presets (shipped and the
// user's) whose model credential it is; a broken preset is left out.
func presetsBySecret() map[string][]string {
	m := map[string][]string{}
	names, _ := preset.List(preset.UserDir())
	for _, n := range names {
		if p, err := preset.Get(n, preset.UserDir()); err == nil && p.Credential != nil {
			m[p.Credential.Secret] = append(m[p.Credential.Secret], p.Name)
		}
	}
	return m
}

// RemoveCredential deletes a secret (errdefs.ErrNotFound when there is
// none of that name).
func (s *Service) RemoveCredential(ctx context.Context, name string) error {
	return s.creds().Remove(name)
}

// LoginResult says what `smx creds login` stored.
type LoginResult struct {
	Preset string `json:"preset"`
	Secret string `json:"secret"` // the name it is stored under
	Bytes  int    `json:"bytes,omitempty"`
	Header string `json:"header,omitempty"` // the header an API key is sent in
	// For an imported sign-in: the file read, what it is (the
	// subscription or account, when the file says) and when the access
	// token expires (the host refreshes it before).
	File    string    `json:"file,omitempty"`
	What    string    `json:"what,omitempty"`
	Expires time.Time `json:"expires,omitzero"`
}

// loginPreset is preset name when it sends a model credential.
func (s *Service) loginPreset(name string) (*preset.Preset, error) {
	p, err := s.GetPreset(name)
	if err != nil {
		return nil, err
	}
	if p.Credential == nil {
		return nil, fmt.Errorf("preset %s uses no model credential: %w", p.Name, errdefs.ErrInvalid)
	}
	return p, nil
}

// SetPresetKey stores the model API key preset name sends, under the
// preset's secret name, so `smx agent run` finds it; it replaces a
// sign-in stored before. The key stays on the host: the guest gets the
// preset's placeholder.
func (s *Service) SetPresetKey(ctx context.Context, name string, key []byte) (*LoginResult, error) {
	p, err := s.loginPreset(name)
	if err != nil {
		return nil, err
	}
	key = []byte(strings.TrimSpace(string(key)))
	if len(key) == 0 {
		return nil, fmt.Errorf("no key given: paste it at the prompt, pipe it in, or use --from-env VAR: %w", errdefs.ErrInvalid)
	}
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	store := s.creds()
	if err := store.Set(p.Credential.Secret, key); err != nil {
		return nil, err
	}
	if err := store.Remove(p.Credential.Secret + ".oauth"); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	return &LoginResult{Preset: p.Name, Secret: p.Credential.Secret, Bytes: len(key), Header: p.Credential.Header}, nil
}

// ImportSignIn stores the host user's own subscription sign-in of preset
// name's agent, read from file (default: the preset's, under $HOME, of
// the user the service runs as). The host refreshes it before it expires;
// the guest gets a placeholder sign-in.
func (s *Service) ImportSignIn(ctx context.Context, name, file string) (*LoginResult, error) {
	p, err := s.loginPreset(name)
	if err != nil {
		return nil, err
	}
	o := p.Credential.OAuth
	if o == nil {
		return nil, fmt.Errorf("preset %s has no sign-in to import: store an API key instead: %w", p.Name, errdefs.ErrInvalid)
	}
	if file == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, err
		}
		file = filepath.Join(home, o.File)
	}
	var access, what string
	var oa creds.OAuth
	switch o.Import {
	case "claude":
		access, oa, what, err = creds.ImportClaude(file, o.TokenURL, o.ClientID)
	case "codex":
		access, oa, what, err = creds.ImportCodex(file, o.TokenURL, o.ClientID)
	case "gemini":
		access, oa, err = creds.ImportGemini(file, o.TokenURL, o.ClientID, o.ClientSecret)
	}
	if err != nil {
		return nil, err
	}
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	if err := s.creds().SetOAuth(p.Credential.Secret, access, oa); err != nil {
		return nil, err
	}
	return &LoginResult{Preset: p.Name, Secret: p.Credential.Secret, File: file, What: what, Expires: oa.ExpiresAt}, nil
}

// MaxCredentialBytes is the largest secret the store keeps: a caller
// reading one from a stream reads no more than one byte past it.
const MaxCredentialBytes = creds.MaxValue
