package creds

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/statedir"
)

// A sign-in (OAuth) credential is two entries: NAME holds the access token
// (what the gateway sends, like any secret) and NAME.oauth the refresh
// material (OAuth below). GetFresh refreshes the access token on the host
// shortly before it expires, so a long agent session keeps working while
// neither token ever enters the guest.

// OAuth is the refresh material of a sign-in credential.
type OAuth struct {
	RefreshToken string    `json:"refresh_token"`
	ExpiresAt    time.Time `json:"expires_at"`
	TokenURL     string    `json:"token_url"`
	ClientID     string    `json:"client_id"`
	Scope        string    `json:"scope,omitempty"`
	// ClientSecret is an installed application's client secret, which some
	// token endpoints (Google's) want with every refresh. It is public (it
	// ships inside the agent's CLI), not a secret of the user's.
	ClientSecret string `json:"client_secret,omitempty"`
	// Form sends the refresh as an HTML form (RFC 6749 section 6) rather
	// than JSON.
	Form bool `json:"form,omitempty"`
	// Source is where it was imported from (the agent's own file).
	Source string `json:"source,omitempty"`
	// AccessHash identifies the access token stored with this material
	// (a short SHA-256 prefix, not the token): see accessOf.
	AccessHash string `json:"access_hash,omitempty"`
}

const oauthSuffix = ".oauth"

// refreshBefore is how long before expiry a token is refreshed.
const refreshBefore = 5 * time.Minute

// SetOAuth stores a sign-in: the access token under name and the refresh
// material under name.oauth.
func (s Store) SetOAuth(name, accessToken string, o OAuth) error {
	if o.RefreshToken == "" || o.TokenURL == "" {
		return fmt.Errorf("creds: sign-in %s: no refresh token or token URL: %w", name, errdefs.ErrInvalid)
	}
	o.AccessHash = accessHash([]byte(accessToken))
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	// The refresh material first: a crash between the two writes must not
	// lose a rotated refresh token (the old one is spent).
	if err := s.Set(name+oauthSuffix, b); err != nil {
		return err
	}
	return s.Set(name, []byte(accessToken))
}

// OAuthOf returns name's refresh material, or ErrNotFound for a plain
// secret.
func (s Store) OAuthOf(name string) (*OAuth, error) {
	b, err := s.Get(name + oauthSuffix)
	if err != nil {
		return nil, err
	}
	var o OAuth
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, fmt.Errorf("creds: %s%s: %v: %w", name, oauthSuffix, err, errdefs.ErrInvalid)
	}
	return &o, nil
}

var refreshMu sync.Mutex // one refresh at a time per process (tokens rotate)

func accessHash(token []byte) string {
	h := sha256.Sum256(token)
	return hex.EncodeToString(h[:8])
}

// accessOf reads name's access token as o, its refresh material, describes
// it. SetOAuth stores the material first and the token next, so a reader
// between the two got the previous token (still valid, but not the one o
// says): on a mismatch the reader waits for the writer (a refresh in this
// process holds refreshMu, one in another process the credential's lock
// file) and reads again. Material stored before AccessHash existed is
// taken as it is.
func (s Store) accessOf(name string, o *OAuth) ([]byte, error) {
	b, err := s.Get(name)
	if err != nil || o.AccessHash == "" || accessHash(b) == o.AccessHash {
		return b, err
	}
	refreshMu.Lock()
	refreshMu.Unlock()
	if unlock, err := s.lockFile(name); err == nil {
		unlock()
	}
	return s.Get(name)
}

// HTTPClient makes refresh requests; tests may replace it.
var HTTPClient = &http.Client{Timeout: 30 * time.Second}

// GetFresh is Get, except that a sign-in credential whose access token
// expires within a few minutes is refreshed first (and stored). A failed
// refresh returns the old token with no error while it is still valid,
// and the error once it has expired.
func (s Store) GetFresh(name string) ([]byte, error) {
	o, err := s.OAuthOf(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return s.Get(name)
	}
	if err != nil {
		return nil, err
	}
	if time.Until(o.ExpiresAt) > refreshBefore {
		return s.accessOf(name, o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Refresh(ctx, name, refreshBefore); err != nil && time.Now().After(o.ExpiresAt) {
		return nil, err
	}
	return s.Get(name)
}

// Refresh exchanges name's refresh token for a new access token when it
// expires within `within` (always with within < 0), and stores both.
func (s Store) Refresh(ctx context.Context, name string, within time.Duration) (bool, error) {
	refreshMu.Lock()
	defer refreshMu.Unlock()
	unlock, err := s.lockFile(name)
	if err != nil {
		return false, err
	}
	defer unlock()
	o, err := s.OAuthOf(name) // again: another process may have refreshed it
	if err != nil {
		return false, err
	}
	if within >= 0 && time.Until(o.ExpiresAt) > within {
		return false, nil
	}
	body := map[string]string{"grant_type": "refresh_token", "refresh_token": o.RefreshToken, "client_id": o.ClientID}
	if o.Scope != "" {
		body["scope"] = o.Scope
	}
	if o.ClientSecret != "" {
		body["client_secret"] = o.ClientSecret
	}
	enc, ctype := []byte(nil), "application/json"
	if o.Form {
		form := url.Values{}
		for k, v := range body {
			form.Set(k, v)
		}
		enc, ctype = []byte(form.Encode()), "application/x-www-form-urlencoded"
	} else {
		enc, _ = json.Marshal(body)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.TokenURL, bytes.NewReader(enc))
	if err != nil {
		return false, fmt.Errorf("creds: refresh %s: %w", name, err)
	}
	req.Header.Set("Content-Type", ctype)
	req.Header.Set("Accept", "application/json")
	resp, err := HTTPClient.Do(req)
	if err != nil {
		return false, fmt.Errorf("creds: refresh %s at %s: %w", name, hostOf(o.TokenURL), err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("creds: refresh %s at %s: %s: sign in again (`smx creds login ... --import`): %w",
			name, hostOf(o.TokenURL), resp.Status, errdefs.ErrDenied)
	}
	var tok struct {
		AccessToken  string `json:"access_token"`
		RefreshToken string `json:"refresh_token"`
		ExpiresIn    int64  `json:"expires_in"`
	}
	if err := json.Unmarshal(raw, &tok); err != nil || tok.AccessToken == "" {
		return false, fmt.Errorf("creds: refresh %s: the answer has no access token: %w", name, errdefs.ErrFailed)
	}
	if tok.RefreshToken != "" {
		o.RefreshToken = tok.RefreshToken // rotated
	}
	if tok.ExpiresIn <= 0 {
		tok.ExpiresIn = 3600
	}
	o.ExpiresAt = time.Now().Add(time.Duration(tok.ExpiresIn) * time.Second).UTC().Truncate(time.Second)
	if err := s.SetOAuth(name, tok.AccessToken, *o); err != nil {
		return false, err
	}
	return true, nil
}

func hostOf(u string) string {
	if p, err := url.Parse(u); err == nil && p.Host != "" {
		return p.Host
	}
	return "the token endpoint"
}

// lockFile serialises refreshes of one credential across processes (each
// supervisor refreshes on its own, and refresh tokens are single-use).
func (s Store) lockFile(name string) (func(), error) {
	if err := s.ensureDir(); err != nil {
		return nil, err
	}
	l, err := statedir.LockFile(filepath.Join(s.Dir, "."+name+".lock"))
	if err != nil {
		return nil, err
	}
	return func() { l.Unlock() }, nil
}

// Importers read the host user's own sign-in of an agent CLI.

// ImportClaude reads Claude Code's sign-in (~/.claude/.credentials.json):
// the access token, the refresh material and the subscription type.
func ImportClaude(path, tokenURL, clientID string) (access string, o OAuth, subscription string, err error) {
	var f struct {
		OAuth struct {
			AccessToken      string   `json:"accessToken"`
			RefreshToken     string   `json:"refreshToken"`
			ExpiresAt        int64    `json:"expiresAt"` // ms since the epoch
			Scopes           []string `json:"scopes"`
			SubscriptionType string   `json:"subscriptionType"`
		} `json:"claudeAiOauth"`
	}
	if err := readJSON(path, &f); err != nil {
		return "", o, "", err
	}
	a := f.OAuth
	if a.AccessToken == "" || a.RefreshToken == "" {
		return "", o, "", fmt.Errorf("creds: %s holds no Claude sign-in (claudeAiOauth): sign in with `claude` on this machine first: %w", path, errdefs.ErrNotFound)
	}
	return a.AccessToken, OAuth{RefreshToken: a.RefreshToken, ExpiresAt: time.UnixMilli(a.ExpiresAt).UTC(),
		TokenURL: tokenURL, ClientID: clientID, Scope: strings.Join(a.Scopes, " "), Source: path}, a.SubscriptionType, nil
}

// ImportCodex reads Codex CLI's sign-in (~/.codex/auth.json). Its access
// token is a JWT whose expiry is not read here: it is refreshed after an
// hour, as Codex itself does about as often.
func ImportCodex(path, tokenURL, clientID string) (access string, o OAuth, account string, err error) {
	var f struct {
		Tokens struct {
			AccessToken  string `json:"access_token"`
			RefreshToken string `json:"refresh_token"`
			AccountID    string `json:"account_id"`
		} `json:"tokens"`
	}
	if err := readJSON(path, &f); err != nil {
		return "", o, "", err
	}
	t := f.Tokens
	if t.AccessToken == "" || t.RefreshToken == "" {
		return "", o, "", fmt.Errorf("creds: %s holds no ChatGPT sign-in (tokens): sign in with `codex login` on this machine first: %w", path, errdefs.ErrNotFound)
	}
	return t.AccessToken, OAuth{RefreshToken: t.RefreshToken, ExpiresAt: time.Now().Add(time.Hour).UTC().Truncate(time.Second),
		TokenURL: tokenURL, ClientID: clientID, Scope: "openid profile email", Source: path}, t.AccountID, nil
}

// ImportGemini reads Gemini CLI's "Login with Google" sign-in
// (~/.gemini/oauth_creds.json, google-auth-library's credentials: tokens
// and expiry_date in ms since the epoch). Google's token endpoint takes the
// refresh as a form with the CLI's own (public) client id and secret.
func ImportGemini(path, tokenURL, clientID, clientSecret string) (access string, o OAuth, err error) {
	var f struct {
		AccessToken  string `json:"access_token"`
		RefreshToken string `json:"refresh_token"`
		Scope        string `json:"scope"`
		ExpiryDate   int64  `json:"expiry_date"` // ms since the epoch
	}
	if err := readJSON(path, &f); err != nil {
		return "", o, err
	}
	if f.AccessToken == "" || f.RefreshToken == "" {
		return "", o, fmt.Errorf("creds: %s holds no Google sign-in (access_token, refresh_token): sign in with `gemini` (Login with Google) on this machine first: %w", path, errdefs.ErrNotFound)
	}
	exp := time.UnixMilli(f.ExpiryDate).UTC()
	if f.ExpiryDate == 0 {
		exp = time.Now().UTC() // unknown: refresh at first use
	}
	return f.AccessToken, OAuth{RefreshToken: f.RefreshToken, ExpiresAt: exp, TokenURL: tokenURL, ClientID: clientID,
		ClientSecret: clientSecret, Form: true, Source: path}, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("creds: %s does not exist: sign in with the agent's own CLI on this machine first, or use an API key: %w", path, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("creds: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("creds: %s: %v: %w", path, err, errdefs.ErrInvalid)
	}
	return nil
}
