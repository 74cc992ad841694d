package netstack

import (
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/smx-dev/smx/internal/audit"
)

// A credential with request matchers goes only with the requests they
// match; the others are forwarded without it.
func TestBrokerRequestMatchers(t *testing.T) {
	addr, upRoots := upstreamTLS(t, "api.broker.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "auth=%s", r.Header.Get("Authorization"))
	}))
	prof := mustProfile(t, `
network:
  mode: default-deny
  allow:
    - domain: api.broker.test
      ports: [443]
credentials:
  - name: api
    from: api-key
    domain: api.broker.test
    header: Authorization
    format: "Bearer {}"
    methods: [GET]
    paths: [/repos/acme/*/pulls]
`)
	r, ca := inspectRig(t, func(c *Config) {
		c.UpstreamRoots = upRoots
		c.Policy = ProfilePolicy(prof)
		c.Credentials = ProfileCredentials(prof)
	})
	r.route("tcp", "203.0.113.9:443", addr)
	r.resolve(t, "api.broker.test")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	cl := r.guestHTTPS("203.0.113.9:443", roots)
	defer cl.CloseIdleConnections()
	for _, tc := range []struct {
		method, path string
		want         string
	}{
		{"GET", "/repos/acme/app/pulls", "auth=Bearer " + testSecret},
		{"POST", "/repos/acme/app/pulls", "auth="},
		{"GET", "/repos/acme/app/issues", "auth="},
		{"GET", "/repos/acme/x/%2e%2e/app/pulls", "auth="},
		{"GET", "/repos/other/app/pulls", "auth="},
	} {
		req, _ := http.NewRequest(tc.method, "https://api.broker.test"+tc.path, nil)
		req.URL.RawPath = tc.path
		req.Header.Set("Authorization", "Bearer smx-placeholder")
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.method, tc.path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != tc.want {
			t.Errorf("%s %s: upstream saw %q, want %q", tc.method, tc.path, b, tc.want)
		}
	}
	cl.CloseIdleConnections()
	r.waitEvent("flow summary", func(e Event) bool { return e.Kind == audit.KindNetFlow && e.Credential == "api" })
	uses := 0
	for _, e := range r.eventsSnapshot() {
		if e.Kind == audit.KindCredUse {
			uses++
			if e.Path != "/repos/acme/app/pulls" || e.Method != "GET" {
				t.Errorf("cred.use for %s %s", e.Method, e.Path)
			}
		}
	}
	if uses != 1 {
		t.Errorf("%d cred.use events, want 1", uses)
	}
}

// forgeEcho is a ForgeGateway for api.broker.test that forwards each
// request through the transport it is given and records what it saw.
type forgeEcho struct {
	mu    sync.Mutex
	hosts []string
	bases []string
}

func (f *forgeEcho) IsForge(host string) bool { return host == "api.broker.test" }
func (f *forgeEcho) HasForges() bool          { return true }
func (f *forgeEcho) Handler(host string, base *url.URL, rt http.RoundTripper) http.Handler {
	f.mu.Lock()
	f.hosts, f.bases = append(f.hosts, host), append(f.bases, base.String())
	f.mu.Unlock()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out, _ := http.NewRequest(r.Method, base.String()+r.URL.Path, nil)
		resp, err := rt.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Fprintf(w, "forge saw %s", b)
	})
}

// A forge's TLS is terminated with the sandbox CA and handed to the forge
// gateway whatever rule allowed the flow: a domain rule, or allow-all with
// a raw address (the server name decides).
func TestForgeHandoff(t *testing.T) {
	addr, upRoots := upstreamTLS(t, "api.broker.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "path=%s", r.URL.Path)
	}))
	for _, tc := range []struct {
		name, profile string
		resolve       bool
	}{
		{"domain rule", "network:\n  mode: default-deny\n  allow:\n    - domain: api.broker.test\n      ports: [443]\n", true},
		{"allow-all, raw address", "network:\n  mode: allow-all\n  allow:\n    - cidr: 203.0.113.0/24\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fg := &forgeEcho{}
			prof := mustProfile(t, tc.profile)
			r, ca := inspectRig(t, func(c *Config) {
				c.UpstreamRoots = upRoots
				c.Policy = ProfilePolicy(prof)
				c.Credentials = ProfileCredentials(prof)
				c.Forge = fg
			})
			r.route("tcp", "203.0.113.9:443", addr)
			if tc.resolve {
				r.resolve(t, "api.broker.test")
			}
			roots := x509.NewCertPool()
			roots.AppendCertsFromPEM(ca.CertPEM())
			cl := r.guestHTTPS("203.0.113.9:443", roots)
			defer cl.CloseIdleConnections()
			resp, err := cl.Get("https://api.broker.test/acme/app/info/refs")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "forge saw path=/acme/app/info/refs" {
				t.Fatalf("guest got %q", b)
			}
			if resp.TLS.PeerCertificates[0].Issuer.CommonName != "smx sandbox CA test" {
				t.Errorf("not terminated with the sandbox CA: %v", resp.TLS.PeerCertificates[0].Issuer)
			}
			fg.mu.Lock()
			if len(fg.hosts) != 1 || fg.hosts[0] != "api.broker.test" || fg.bases[0] != "https://api.broker.test" {
				t.Errorf("handler for %v %v", fg.hosts, fg.bases)
			}
			fg.mu.Unlock()
			// The guest meets the gateway's certificate, never the forge's own.
			if !strings.Contains(tc.name, "raw") {
				return
			}
			other := r.guestHTTPS("203.0.113.9:443", upRoots)
			defer other.CloseIdleConnections()
			req, _ := http.NewRequest("GET", "https://api.broker.test/x", nil)
			other.Transport.(*http.Transport).TLSClientConfig.ServerName = "api.broker.test"
			if _, err := other.Do(req); err == nil {
				t.Error("a guest trusting only the upstream's CA accepted the gateway's certificate for a forge")
			}
		})
	}
}
