package console

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/statedir"
)

// serve runs a console over the real API server on an empty state
// directory and returns its base URL and login token.
func serve(t *testing.T) (string, string, *Console) {
	t.Helper()
	state := statedir.Dir{Root: t.TempDir()}
	if err := state.Ensure(); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c, token, err := New(&api.Server{Backend: api.ServiceBackend{S: service.New(state, nil)}}, ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { api.Serve(ctx, ln, c); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + ln.Addr().String(), token, c
}

type check struct {
	method, path string
	header       map[string]string
	want         int
}

func do(t *testing.T, cl *http.Client, base string, c check) (int, string) {
	t.Helper()
	req, err := http.NewRequest(c.method, base+c.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range c.header {
		if k == "Host" {
			req.Host = v
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestFrontDoor(t *testing.T) {
	base, token, con := serve(t)
	port := base[strings.LastIndex(base, ":")+1:]
	jar, _ := cookiejar.New(nil)
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	anon := &http.Client{CheckRedirect: noRedirect}
	user := &http.Client{Jar: jar, CheckRedirect: noRedirect}

	for _, c := range []check{
		{"GET", "/", nil, http.StatusUnauthorized},
		{"GET", "/v1/sandboxes", nil, http.StatusUnauthorized},
		{"GET", "/login?token=" + strings.Repeat("0", len(token)), nil, http.StatusForbidden},
		{"GET", "/login", nil, http.StatusForbidden},
		// DNS rebinding: the attacker's name resolves to 127.0.0.1.
		{"GET", "/login?token=" + token, map[string]string{"Host": "attacker.example:" + port}, http.StatusMisdirectedRequest},
		{"GET", "/style.css", nil, http.StatusOK},
	} {
		if got, body := do(t, anon, base, c); got != c.want {
			t.Errorf("%s %s %v: status %d, want %d: %s", c.method, c.path, c.header, got, c.want, body)
		}
	}

	// The token, still unused after the refusals above, logs in once.
	resp, err := user.Get(base + "/login?token=" + token)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("login: %s, Location %q; want 303 to /", resp.Status, resp.Header.Get("Location"))
	}
	sc := resp.Header.Get("Set-Cookie")
	for _, want := range []string{"smx_console_" + port + "=", "Path=/", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(sc, want) {
			t.Errorf("Set-Cookie %q lacks %q", sc, want)
		}
	}
	if got, _ := do(t, anon, base, check{"GET", "/login?token=" + token, nil, 0}); got != http.StatusForbidden {
		t.Errorf("second use of the token: status %d, want 403", got)
	}

	u, _ := url.Parse(base)
	origin := "http://" + u.Host
	for _, c := range []check{
		{"GET", "/", nil, http.StatusOK},
		{"GET", "/v1/sandboxes", nil, http.StatusOK},
		// localhost passes the Host check (the cookie, set for
		// 127.0.0.1, is not a session there).
		{"GET", "/v1/sandboxes", map[string]string{"Host": "localhost:" + port}, http.StatusUnauthorized},
		{"GET", "/v1/sandboxes", map[string]string{"Host": "attacker.example:" + port}, http.StatusMisdirectedRequest},
		{"GET", "/v1/sandboxes", map[string]string{"Origin": "http://attacker.example"}, http.StatusForbidden},
		{"GET", "/v1/sandboxes", map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		// A form another site posts carries its Origin; one without any
		// Origin is not a browser's same-origin fetch either.
		{"POST", "/v1/sandboxes/x/start", map[string]string{"Origin": "http://attacker.example"}, http.StatusForbidden},
		{"POST", "/v1/sandboxes/x/start", map[string]string{"Origin": "null"}, http.StatusForbidden},
		{"POST", "/v1/sandboxes/x/start", nil, http.StatusForbidden},
		{"POST", "/v1/sandboxes/x/start", map[string]string{"Origin": origin}, http.StatusNotFound}, // reached the API
	} {
		if got, body := do(t, user, base, c); got != c.want {
			t.Errorf("logged in: %s %s %v: status %d, want %d: %s", c.method, c.path, c.header, got, c.want, body)
		}
	}
	// Another browser gets a login of its own (smx ui prints a new URL
	// on Enter); the first session stays.
	jar2, _ := cookiejar.New(nil)
	other := &http.Client{Jar: jar2, CheckRedirect: noRedirect}
	if got, _ := do(t, other, base, check{"GET", "/login?token=" + con.NewToken(), nil, 0}); got != http.StatusSeeOther {
		t.Errorf("a new token: status %d, want 303", got)
	}
	for _, cl := range []*http.Client{user, other} {
		if got, _ := do(t, cl, base, check{"GET", "/v1/sandboxes", nil, 0}); got != http.StatusOK {
			t.Errorf("after a second login: status %d, want 200 for both browsers", got)
		}
	}
	// A cookie from a console on another port is not a session here.
	forged := &http.Client{CheckRedirect: noRedirect}
	if got, _ := do(t, forged, base, check{"GET", "/v1/sandboxes", map[string]string{"Cookie": "smx_console_" + port + "=" + strings.Repeat("a", 64)}, 0}); got != http.StatusUnauthorized {
		t.Errorf("made-up session: status %d, want 401", got)
	}
}
