// Package console serves smx's web console: a few static pages, embedded
// in the binary, that call the same HTTP API routes as the CLI's clients
// (internal/api). It owns only the console's front door: a one-time
// login token exchanged for a session cookie, and the Host and Origin
// checks that keep other web pages (DNS rebinding, cross-site requests)
// from driving the API through the user's browser. Everything it shows
// comes from the API; it holds no state of the sandboxes.
package console

import (
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

//go:embed assets
var assets embed.FS

// SessionTTL is how long a console session lasts after login.
const SessionTTL = 12 * time.Hour

// Console is an http.Handler for one listener. Create it with New once
// the listener's address is known; it is safe for concurrent use.
type Console struct {
	api    http.Handler
	hosts  map[string]bool // Host header values accepted
	cookie string          // the session cookie's name, per port

	mu       sync.Mutex
	token    string // "" once used
	sessions map[string]time.Time
	files    http.Handler
}

// New serves the console for a listener at addr (host:port as bound),
// sending /v1/ to api, which must not check a token of its own: the
// console's session stands in for it. It returns the console and the
// one-time login token.
func New(api http.Handler, addr net.Addr) (*Console, string, error) {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return nil, "", fmt.Errorf("console: listener address %s: %w", addr, err)
	}
	hosts := map[string]bool{net.JoinHostPort(host, port): true}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		// The names a browser on this machine reaches loopback by;
		// any other name is a page that rebound its DNS to us.
		for _, h := range []string{"localhost", "127.0.0.1", "::1"} {
			hosts[net.JoinHostPort(h, port)] = true
		}
	}
	sub, _ := fs.Sub(assets, "assets")
	c := &Console{api: api, hosts: hosts, cookie: "smx_console_" + port,
		sessions: map[string]time.Time{}, files: http.FileServerFS(sub)}
	return c, c.NewToken(), nil
}

// NewToken makes a new one-time login token (for another browser), which
// replaces the last one if that was not used yet.
func (c *Console) NewToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.token = hex.EncodeToString(b)
	return c.token
}

// URL is the login address a user opens for a listener at addr.
func URL(addr net.Addr, token string) string {
	host, port, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/login?token=" + token
}

func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if !c.hosts[r.Host] {
		// A DNS-rebinding page reaches this port under its own name.
		http.Error(w, "smx console: unexpected Host "+r.Host+": open the URL smx ui printed", http.StatusMisdirectedRequest)
		return
	}
	if !c.sameOrigin(r) {
		http.Error(w, "smx console: cross-origin request refused", http.StatusForbidden)
		return
	}
	if r.URL.Path == "/login" {
		c.login(w, r)
		return
	}
	if r.URL.Path == "/style.css" || r.URL.Path == "/app.js" {
		// The same for everyone (the login pages use the style too).
		c.files.ServeHTTP(w, r)
		return
	}
	if !c.session(r) {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			h.Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintln(w, `{"class":"denied","message":"not logged in: open the URL smx ui printed"}`)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, page("Not logged in", "Open the login URL that <code>smx ui</code> printed. Its token works once; run <code>smx ui</code> again for a new one."))
		return
	}
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		// The API records who answered a question ("console"); set
		// here, whatever the page sent.
		r.Header.Set("X-Smx-Console", "1")
		c.api.ServeHTTP(w, r)
		return
	}
	c.files.ServeHTTP(w, r)
}

// sameOrigin refuses a request another origin's page sent: an Origin that
// is not this console's, or a state-changing request with no Origin at
// all (browsers send one on every cross-origin request and on same-origin
// POST, PUT, DELETE).
func (c *Console) sameOrigin(r *http.Request) bool {
	if o := r.Header.Get("Origin"); o != "" {
		return o == "http://"+r.Host
	}
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		return true
	}
	return false
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	got := r.URL.Query().Get("token")
	c.mu.Lock()
	ok := c.token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(c.token)) == 1
	var sid string
	if ok {
		c.token = "" // one use: a copied or logged URL opens nothing later
		b := make([]byte, 32)
		rand.Read(b)
		sid = hex.EncodeToString(b)
		c.sessions[sid] = time.Now().Add(SessionTTL)
	}
	c.mu.Unlock()
	if !ok {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, page("Login refused", "This login token is wrong or was used already. Run <code>smx ui</code> again for a new URL."))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: c.cookie, Value: sid, Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: int(SessionTTL / time.Second)})
	// The token leaves the address bar and the history.
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (c *Console) session(r *http.Request) bool {
	ck, err := r.Cookie(c.cookie)
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for sid, exp := range c.sessions {
		if subtle.ConstantTimeCompare([]byte(sid), []byte(ck.Value)) == 1 {
			if time.Now().After(exp) {
				delete(c.sessions, sid)
				return false
			}
			return true
		}
	}
	return false
}

func page(title, body string) string {
	return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>smx console: ` + title +
		`</title><link rel="stylesheet" href="/style.css"></head><body><main class="notice"><h1>` + title +
		`</h1><p>` + body + `</p></main></body></html>`
}
