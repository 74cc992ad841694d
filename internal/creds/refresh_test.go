package creds

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/testutil"
)

type refreshLog struct {
	mu   sync.Mutex
	recs []map[string]any
}

func (l *refreshLog) add(f map[string]any) {
	l.mu.Lock()
	l.recs = append(l.recs, f)
	l.mu.Unlock()
}

func (l *refreshLog) all() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]map[string]any(nil), l.recs...)
}

// wait waits up to 10 s for the refresher to log a record.
func (l *refreshLog) wait(t *testing.T, what string) {
	t.Helper()
	testutil.WaitFor(t, what, 10*time.Second, func() error {
		if len(l.all()) == 0 {
			return fmt.Errorf("no record yet")
		}
		return nil
	})
}

// A running sandbox's sign-in is refreshed ahead of its expiry without any
// request asking for it; the refresh is stored (atomically, 0600) and
// logged without a token.
func TestRefresherAhead(t *testing.T) {
	ts := newTokenServer(t)
	ts.lastRT = "rt-0"
	s := Store{Dir: filepath.Join(t.TempDir(), "creds")}
	exp := time.Now().Add(8 * time.Minute) // inside Ahead (10 min), outside GetFresh's window (5 min)
	if err := s.SetOAuth("claude", "at-0", OAuth{RefreshToken: "rt-0", ExpiresAt: exp, TokenURL: ts.srv.URL, ClientID: "cid"}); err != nil {
		t.Fatal(err)
	}
	s.Set("forge-token", []byte("plain")) // a plain secret is left alone
	var log refreshLog
	r := &Refresher{Store: s, Log: log.add}
	r.SetNames([]string{"claude", "forge-token", "missing"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	log.wait(t, "a refresh")
	if v, err := s.Get("claude"); err != nil || string(v) != "at-b" {
		t.Fatalf("stored token %q, %v", v, err)
	}
	o, _ := s.OAuthOf("claude")
	if o.RefreshToken != "rt-b" || time.Until(o.ExpiresAt) < 50*time.Minute {
		t.Fatalf("stored refresh material %+v", o)
	}
	recs := log.all()
	if len(recs) != 1 || recs[0]["secret"] != "claude" || recs[0]["trigger"] != "ahead" || recs[0]["expires_at"] != o.ExpiresAt.UTC().Format(time.RFC3339) {
		t.Fatalf("cred.refresh records %v", recs)
	}
	if b, _ := json.Marshal(recs); strings.Contains(string(b), "at-") || strings.Contains(string(b), "rt-") {
		t.Fatalf("a token is in the record: %s", b)
	}
	ents, _ := os.ReadDir(s.Dir)
	for _, e := range ents {
		fi, _ := e.Info()
		if !strings.HasPrefix(e.Name(), ".") && fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v", e.Name(), fi.Mode())
		}
		if strings.HasPrefix(e.Name(), ".") && !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("temporary %s left in the store", e.Name())
		}
	}
	// Once fresh, the loop sleeps: no second refresh.
	time.Sleep(100 * time.Millisecond)
	if ts.n != 1 {
		t.Fatalf("%d refreshes", ts.n)
	}
	if v, _ := s.GetFresh("forge-token"); string(v) != "plain" {
		t.Fatalf("plain secret %q", v)
	}
}

// Many readers and the loop at once, with a token about to expire: one
// refresh (the endpoint rotates refresh tokens, so a second exchange of
// the old one would fail), and every reader gets the new token.
func TestRefresherSingleFlight(t *testing.T) {
	ts := newTokenServer(t)
	ts.lastRT = "rt-0"
	s := Store{Dir: filepath.Join(t.TempDir(), "creds")}
	s.SetOAuth("gemini", "at-0", OAuth{RefreshToken: "rt-0", ExpiresAt: time.Now().Add(time.Minute), TokenURL: ts.srv.URL, ClientID: "cid"})
	var log refreshLog
	r := &Refresher{Store: s, Log: log.add}
	r.SetNames([]string{"gemini"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	var wg sync.WaitGroup
	got := make([]string, 16)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := r.Secret("gemini")
			if err != nil {
				t.Error(err)
			}
			got[i] = string(v)
		}()
	}
	wg.Wait()
	log.wait(t, "the refresh record")
	for i, v := range got {
		if v != "at-b" {
			t.Errorf("reader %d got %q", i, v)
		}
	}
	if ts.n != 1 || len(log.all()) != 1 {
		t.Fatalf("%d refreshes, records %v", ts.n, log.all())
	}
}

// A failed refresh is logged with its error (never a token) and retried.
func TestRefresherRetry(t *testing.T) {
	ts := newTokenServer(t)
	ts.lastRT = "rt-0"
	ts.status = http.StatusServiceUnavailable
	s := Store{Dir: filepath.Join(t.TempDir(), "creds")}
	s.SetOAuth("codex", "at-0", OAuth{RefreshToken: "rt-0", ExpiresAt: time.Now().Add(7 * time.Minute), TokenURL: ts.srv.URL, ClientID: "cid"})
	var log refreshLog
	r := &Refresher{Store: s, Log: log.add, Retry: 20 * time.Millisecond}
	r.SetNames([]string{"codex"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	log.wait(t, "a failed refresh")
	if e, _ := log.all()[0]["error"].(string); !strings.Contains(e, "503") || strings.Contains(e, "rt-0") {
		t.Fatalf("failure record %v", log.all()[0])
	}
	ts.mu.Lock()
	ts.status = http.StatusOK
	ts.mu.Unlock()
	testutil.WaitFor(t, "the retried refresh", 10*time.Second, func() error {
		if v, _ := s.Get("codex"); string(v) != "at-b" {
			return fmt.Errorf("codex token is %q, want at-b", v)
		}
		return nil
	})
}

// Gemini's sign-in file is google-auth-library's; Google's token endpoint
// takes a form with the CLI's client id and secret, and does not rotate
// the refresh token.
func TestImportGeminiRefresh(t *testing.T) {
	var mu sync.Mutex
	var forms []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") != "application/x-www-form-urlencoded" {
			http.Error(w, "want a form", http.StatusBadRequest)
			return
		}
		r.ParseForm()
		mu.Lock()
		forms = append(forms, r.PostForm.Encode())
		mu.Unlock()
		if r.PostForm.Get("refresh_token") != "1//host-refresh" || r.PostForm.Get("client_secret") != "csecret" || r.PostForm.Get("client_id") != "cid.apps" {
			http.Error(w, `{"error":"invalid_grant"}`, http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, `{"access_token":"ya29.new","expires_in":3599,"scope":"openid","token_type":"Bearer"}`)
	}))
	defer srv.Close()
	file := filepath.Join(t.TempDir(), "oauth_creds.json")
	os.WriteFile(file, []byte(fmt.Sprintf(`{"access_token":"ya29.host","refresh_token":"1//host-refresh","scope":"openid","token_type":"Bearer","id_token":"eyJ.x.y","expiry_date":%d}`,
		time.Now().Add(2*time.Minute).UnixMilli())), 0o600)
	access, o, err := ImportGemini(file, srv.URL, "cid.apps", "csecret")
	if err != nil || access != "ya29.host" || !o.Form || time.Until(o.ExpiresAt) > 2*time.Minute {
		t.Fatalf("ImportGemini = %q, %+v, %v", access, o, err)
	}
	s := Store{Dir: filepath.Join(t.TempDir(), "creds")}
	if err := s.SetOAuth("gemini", access, o); err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetFresh("gemini"); err != nil || string(v) != "ya29.new" {
		t.Fatalf("GetFresh = %q, %v (forms %q)", v, err, forms)
	}
	if o, _ := s.OAuthOf("gemini"); o.RefreshToken != "1//host-refresh" {
		t.Fatalf("the refresh token was lost: %+v", o)
	}
	// A file without a sign-in says what to do.
	os.WriteFile(file, []byte(`{}`), 0o600)
	if _, _, err := ImportGemini(file, srv.URL, "cid.apps", "csecret"); err == nil || !strings.Contains(err.Error(), "Login with Google") {
		t.Fatalf("empty file: %v", err)
	}
}
