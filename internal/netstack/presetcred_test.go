package netstack

import (
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/preset"
)

// The shipped Claude preset, run with an imported sign-in: the gateway
// adds the real token to model calls and the CLI's account reads, and
// never lets it reach an endpoint that mints another credential from it
// (API-key creation, token exchange): those are refused with 403 and a
// net.refused record naming the rule, and the upstream never sees them,
// however the path is spelled.
func TestBrokerClaudeSignInEndpoints(t *testing.T) {
	const token = "sk-ant-oat01-host-signin-token-7f3e"
	var mu sync.Mutex
	seen := map[string]string{} // path -> Authorization the upstream got
	addr, upRoots := upstreamTLS(t, "api.anthropic.com", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = r.Header.Get("Authorization")
		mu.Unlock()
		fmt.Fprintf(w, "auth=%s", r.Header.Get("Authorization"))
	}))
	p, err := preset.Get("claude", "")
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithSignIn(); err != nil {
		t.Fatal(err)
	}
	prof := mustProfile(t, p.Profile)
	hosts, err := ParseHosts(strings.NewReader("203.0.113.9 api.anthropic.com\n"), "hosts")
	if err != nil {
		t.Fatal(err)
	}
	r, ca := inspectRig(t, func(c *Config) {
		c.UpstreamRoots = upRoots
		c.Policy = ProfilePolicy(prof)
		c.Credentials = ProfileCredentials(prof)
		c.Resolver = hosts
		c.Secret = func(name string) ([]byte, error) {
			if name == "claude" {
				return []byte(token), nil
			}
			return nil, fmt.Errorf("creds: %s: %w", name, os.ErrNotExist)
		}
	})
	r.route("tcp", "203.0.113.9:443", addr)
	r.resolve(t, "api.anthropic.com")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	cl := r.guestHTTPS("203.0.113.9:443", roots)
	defer cl.CloseIdleConnections()

	do := func(method, path string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "https://api.anthropic.com/", nil)
		req.URL.Path, req.URL.RawPath = path, path
		req.URL.Opaque = path // sent as written, encodings and all
		req.Header.Set("Authorization", "Bearer sk-ant-oat01-smx-placeholder")
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct{ method, path string }{
		{"POST", "/v1/messages"},
		{"POST", "/v1/messages/count_tokens"},
		{"GET", "/api/oauth/profile"},
		{"GET", "/api/oauth/usage"},
	} {
		if code, body := do(tc.method, tc.path); code != http.StatusOK || body != "auth=Bearer "+token {
			t.Errorf("%s %s: %d %q, want the host's token", tc.method, tc.path, code, body)
		}
	}
	// Elsewhere on the host the request goes on, without the token.
	if code, body := do("GET", "/api/claude_cli/bootstrap"); code != http.StatusOK || body != "auth=" {
		t.Errorf("GET /api/claude_cli/bootstrap: %d %q, want forwarded without a token", code, body)
	}
	minting := []string{
		"/api/oauth/claude_cli/create_api_key",
		"/api/oauth/claude_cli/create_api_key/",
		"/API/OAuth/Claude_CLI/Create_API_Key",
		"/api/oauth/claude_cli%2fcreate_api_key",
		"/api/oauth/profile/../claude_cli/create_api_key",
		"/api//oauth/claude_cli/create_api_key",
		"/v1/oauth/token",
	}
	for _, path := range minting {
		code, body := do("POST", path)
		if code != http.StatusForbidden || !strings.Contains(body, "credential anthropic is never sent there") {
			t.Errorf("POST %s: %d %q, want 403 from the gateway", path, code, body)
		}
	}
	mu.Lock()
	for path, auth := range seen {
		if strings.Contains(strings.ToLower(path), "create_api_key") || strings.HasPrefix(path, "/v1/oauth") {
			t.Errorf("the upstream got %s (Authorization %q)", path, auth)
		}
	}
	mu.Unlock()
	cl.CloseIdleConnections()
	r.waitEvent("flow summary", func(e Event) bool { return e.Kind == audit.KindNetFlow && e.Credential == "anthropic" })
	refused := 0
	for _, e := range r.eventsSnapshot() {
		switch e.Kind {
		case audit.KindNetRefused:
			refused++
			if !strings.Contains(e.Decision.Rule, "credentials anthropic.deny_paths") || e.Credential != "anthropic" || e.Method != "POST" {
				t.Errorf("refusal %+v: want the deny_paths rule of credential anthropic", e)
			}
		case audit.KindCredUse:
			if strings.Contains(strings.ToLower(e.Path), "create_api_key") || strings.HasPrefix(e.Path, "/v1/oauth") {
				t.Errorf("cred.use for %s %s", e.Method, e.Path)
			}
		}
	}
	if refused != len(minting) {
		t.Errorf("%d net.refused events, want %d", refused, len(minting))
	}
}
