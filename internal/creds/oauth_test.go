package creds

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

// tokenServer is an OAuth token endpoint: it rotates refresh tokens and
// counts refreshes; status overrides its answer.
type tokenServer struct {
	mu      sync.Mutex
	n       int
	status  int
	lastRT  string
	srv     *httptest.Server
	clients []string
}

func newTokenServer(t *testing.T) *tokenServer {
	ts := &tokenServer{status: http.StatusOK}
	ts.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		json.NewDecoder(r.Body).Decode(&body)
		ts.mu.Lock()
		defer ts.mu.Unlock()
		if ts.status != http.StatusOK {
			w.WriteHeader(ts.status)
			return
		}
		if body["grant_type"] != "refresh_token" || body["refresh_token"] != ts.lastRT {
			http.Error(w, "bad refresh token", http.StatusBadRequest)
			return
		}
		ts.n++
		ts.clients = append(ts.clients, body["client_id"])
		ts.lastRT = "rt-" + string(rune('a'+ts.n))
		json.NewEncoder(w).Encode(map[string]any{"access_token": "at-" + string(rune('a'+ts.n)), "refresh_token": ts.lastRT, "expires_in": 3600})
	}))
	t.Cleanup(ts.srv.Close)
	return ts
}

func TestSignInRefresh(t *testing.T) {
	ts := newTokenServer(t)
	s := Store{Dir: filepath.Join(t.TempDir(), "creds")}
	ts.lastRT = "rt-0"
	if err := s.SetOAuth("claude", "at-0", OAuth{RefreshToken: "rt-0", ExpiresAt: time.Now().Add(time.Hour), TokenURL: ts.srv.URL, ClientID: "cid"}); err != nil {
		t.Fatal(err)
	}
	// Far from expiry: the stored token, no refresh.
	if v, err := s.GetFresh("claude"); err != nil || string(v) != "at-0" || ts.n != 0 {
		t.Fatalf("GetFresh = %q, %v (%d refreshes)", v, err, ts.n)
	}
	// Near expiry: refreshed once, the rotated refresh token kept.
	o, _ := s.OAuthOf("claude")
	o.ExpiresAt = time.Now().Add(time.Minute)
	s.SetOAuth("claude", "at-0", *o)
	if v, err := s.GetFresh("claude"); err != nil || string(v) != "at-b" {
		t.Fatalf("GetFresh near expiry = %q, %v", v, err)
	}
	if v, _ := s.GetFresh("claude"); string(v) != "at-b" || ts.n != 1 || ts.clients[0] != "cid" {
		t.Fatalf("second GetFresh = %q after %d refreshes", v, ts.n)
	}
	if o, _ := s.OAuthOf("claude"); o.RefreshToken != "rt-b" || time.Until(o.ExpiresAt) < 50*time.Minute {
		t.Fatalf("stored refresh material: %+v", o)
	}
	// The endpoint fails: a still-valid token is used, an expired one is an error.
	ts.status = http.StatusUnauthorized
	o, _ = s.OAuthOf("claude")
	o.ExpiresAt = time.Now().Add(time.Minute)
	s.SetOAuth("claude", "at-b", *o)
	if v, err := s.GetFresh("claude"); err != nil || string(v) != "at-b" {
		t.Fatalf("failed refresh of a valid token: %q, %v", v, err)
	}
	o.ExpiresAt = time.Now().Add(-time.Minute)
	s.SetOAuth("claude", "at-b", *o)
	if _, err := s.GetFresh("claude"); !errors.Is(err, errdefs.ErrDenied) {
		t.Fatalf("expired token with a failing endpoint: %v", err)
	}
	// A plain secret is just read.
	s.Set("key", []byte("k"))
	if v, err := s.GetFresh("key"); err != nil || string(v) != "k" {
		t.Fatalf("plain secret: %q, %v", v, err)
	}
}

func TestImportSignIns(t *testing.T) {
	dir := t.TempDir()
	cf := filepath.Join(dir, ".credentials.json")
	os.WriteFile(cf, []byte(`{"claudeAiOauth":{"accessToken":"sk-ant-oat01-x","refreshToken":"sk-ant-ort01-y","expiresAt":1900000000000,"scopes":["user:inference"],"subscriptionType":"pro"}}`), 0o600)
	at, o, sub, err := ImportClaude(cf, "https://t.example/token", "cid")
	if err != nil || at != "sk-ant-oat01-x" || o.RefreshToken != "sk-ant-ort01-y" || sub != "pro" ||
		o.ExpiresAt.UnixMilli() != 1900000000000 || o.TokenURL != "https://t.example/token" || o.Scope != "user:inference" {
		t.Fatalf("claude: %q %+v %q %v", at, o, sub, err)
	}
	xf := filepath.Join(dir, "auth.json")
	os.WriteFile(xf, []byte(`{"OPENAI_API_KEY":null,"tokens":{"id_token":"i","access_token":"a","refresh_token":"r","account_id":"acct"}}`), 0o600)
	at, o, acct, err := ImportCodex(xf, "https://t.example/token", "cid")
	if err != nil || at != "a" || o.RefreshToken != "r" || acct != "acct" {
		t.Fatalf("codex: %q %+v %q %v", at, o, acct, err)
	}
	os.WriteFile(xf, []byte(`{"OPENAI_API_KEY":"sk-x"}`), 0o600)
	if _, _, _, err := ImportCodex(xf, "u", "c"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("codex without a sign-in: %v", err)
	}
	if _, _, _, err := ImportClaude(filepath.Join(dir, "nosuch"), "u", "c"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing file: %v", err)
	}
}
