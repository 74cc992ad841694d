package netstack

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/internal/tlsgw"
)

const inspectProfile = `
network:
  mode: default-deny
  allow:
    - domain: allowed.test
    - domain: proxy.test
      ports: [3128]
    - domain: api.broker.test
      ports: [443]
    - domain: nokey.broker.test
      ports: [443]
    - cidr: 198.51.100.0/24
  deny:
    - domain: denied.allowed.test
credentials:
  - name: api
    from: api-key
    domain: api.broker.test
    header: Authorization
    format: "Bearer {}"
  - name: nokey
    from: absent-key
    domain: nokey.broker.test
    header: X-Api-Key
`

const inspectHosts = `
203.0.113.5   allowed.test
203.0.113.9   api.broker.test
203.0.113.11  nokey.broker.test
203.0.113.10  proxy.test
`

const testSecret = "s3cret-value-never-logged"

// inspectRig is a rig with inspectProfile, its names, a credential store
// holding api-key, and a sandbox CA.
func inspectRig(t testing.TB, opts ...rigOpt) (*rig, *tlsgw.CA) {
	t.Helper()
	prof := mustProfile(t, inspectProfile)
	hosts, err := ParseHosts(strings.NewReader(inspectHosts), "hosts")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := tlsgw.New("test")
	if err != nil {
		t.Fatal(err)
	}
	all := append([]rigOpt{func(c *Config) {
		c.Policy = ProfilePolicy(prof)
		c.Credentials = ProfileCredentials(prof)
		c.Resolver = hosts
		c.CA = ca
		c.Secret = func(name string) ([]byte, error) {
			if name == "api-key" {
				return []byte(testSecret + "\n"), nil
			}
			return nil, fmt.Errorf("creds: %s: %w", name, os.ErrNotExist)
		}
	}}, opts...)
	return newRig(t, all...), ca
}

// resolve makes the gateway's DNS answer name, as a guest would before
// connecting.
func (r *rig) resolve(t *testing.T, name string) {
	t.Helper()
	m, err := r.query(name, dns.TypeA, false)
	if err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) == 0 {
		t.Fatalf("resolve %s: %v, %v", name, m, err)
	}
}

// tlsEchoServer is an HTTPS server on loopback answering with the SNI it saw.
func tlsEchoServer(t *testing.T) string {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "sni=%s host=%s", r.TLS.ServerName, r.Host)
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "https://")
}

// guestTLSGet does an HTTPS GET from the guest to dst with sni as the
// server name ("" sends none), not verifying the server.
func (r *rig) guestTLSGet(t *testing.T, dst, sni, host string) (string, error) {
	c := &http.Client{Transport: &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c, err := r.dialTCP(ctx, dst)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return tc, nil
		},
	}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get("https://" + host + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func refusedWith(r *rig, rule string) Event {
	return r.waitEvent("refusal "+rule, func(e Event) bool {
		return e.Kind == audit.KindNetRefused && strings.Contains(e.Decision.Rule, rule)
	})
}

func TestInspectSNI(t *testing.T) {
	r, _ := inspectRig(t)
	up := tlsEchoServer(t)
	r.route("tcp", "203.0.113.5:443", up)
	r.route("tcp", "198.51.100.10:443", up)
	r.resolve(t, "allowed.test")

	body, err := r.guestTLSGet(t, "203.0.113.5:443", "allowed.test", "allowed.test")
	if err != nil || body != "sni=allowed.test host=allowed.test" {
		t.Fatalf("allowed SNI: %q, %v", body, err)
	}
	e := r.waitEvent("flow", func(e Event) bool { return e.Kind == audit.KindNetFlow && e.SNI == "allowed.test" })
	if e.Fields()["sni"] != "allowed.test" || e.BytesOut == 0 || e.BytesIn == 0 {
		t.Errorf("flow = %+v", e)
	}

	// Another name on the allowed name's address: refused before dialling.
	r.mu.Lock()
	dials := len(r.dialed)
	r.mu.Unlock()
	if _, err := r.guestTLSGet(t, "203.0.113.5:443", "evil.test", "evil.test"); err == nil {
		t.Fatal("mismatched SNI got through")
	}
	e = r.waitEvent("SNI refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused && e.SNI == "evil.test" })
	if e.Decision.Rule != "default deny" || !strings.Contains(e.Decision.Reason, `TLS server name "evil.test"`) ||
		!strings.Contains(e.Decision.Reason, "allowed for allowed.test") || e.Fields()["sni"] != "evil.test" {
		t.Errorf("refusal = %+v", e)
	}
	// A deny rule holds against a name allowed by the flow's rule.
	if _, err := r.guestTLSGet(t, "203.0.113.5:443", "denied.allowed.test", "x"); err == nil {
		t.Fatal("denied SNI got through")
	}
	e = r.waitEvent("deny-rule refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused && e.SNI == "denied.allowed.test" })
	if !strings.Contains(e.Decision.Rule, "network.deny[0]") {
		t.Errorf("refusal = %+v", e)
	}
	r.mu.Lock()
	if len(r.dialed) != dials {
		t.Errorf("refused flows were dialled: %v", r.dialed[dials:])
	}
	r.mu.Unlock()

	// No SNI at all under a domain rule.
	if _, err := r.guestTLSGet(t, "203.0.113.5:443", "", "allowed.test"); err == nil {
		t.Fatal("TLS without SNI got through")
	}
	refusedWith(r, RuleNoName)

	// A flow allowed by a cidr rule is not inspected.
	body, err = r.guestTLSGet(t, "198.51.100.10:443", "evil.test", "evil.test")
	if err != nil || body != "sni=evil.test host=evil.test" {
		t.Fatalf("cidr flow: %q, %v", body, err)
	}
}

func TestInspectHTTPHost(t *testing.T) {
	r, _ := inspectRig(t)
	r.route("tcp", "203.0.113.5:80", httpServer(t))
	r.resolve(t, "allowed.test")
	if body, err := r.guestGet(t, "203.0.113.5:80", "allowed.test"); err != nil || body != "hello allowed.test" {
		t.Fatalf("allowed Host: %q, %v", body, err)
	}
	if body, err := r.guestGet(t, "203.0.113.5:80", "evil.test"); err == nil && !gatewayRefusal("HTTP/1.1 403 Forbidden\r\n"+body) {
		t.Fatalf("Host header naming another domain got through: %q", body)
	}
	e := r.waitEvent("Host refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused && e.HTTPHost == "evil.test" })
	if e.Decision.Rule != "default deny" || e.Fields()["http_host"] != "evil.test" {
		t.Errorf("refusal = %+v", e)
	}

	// The dialled address itself as Host names nothing new.
	if body, err := r.guestGet(t, "203.0.113.5:80", "203.0.113.5"); err != nil || body != "hello 203.0.113.5" {
		t.Fatalf("Host = dialled address: %q, %v", body, err)
	}

	// Raw requests: no Host, two Hosts, an absolute-form target naming
	// another host.
	for _, tc := range []struct{ req, rule string }{
		{"GET / HTTP/1.0\r\n\r\n", RuleNoName},
		{"GET / HTTP/1.1\r\nHost: allowed.test\r\nHost: evil.test\r\n\r\n", RuleMalformed},
		{"GET http://evil.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "default deny"},
		{"GET / HTTP/1.1\r\nHost: 203.0.113.6\r\n\r\n", "malformed request"}, // another address
	} {
		n := len(r.eventsSnapshot())
		// The gateway's 403, or a reset for framing it will not parse.
		if got := r.rawExchange(t, "203.0.113.5:80", tc.req); got != "" && !gatewayRefusal(got) {
			t.Errorf("%q got an answer other than the gateway's 403: %q", tc.req, got)
		}
		r.waitEventAfter(t, n, "refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused && e.Flow.Dst.Port() == 80 })
		found := false
		for _, e := range r.eventsSnapshot()[n:] {
			if e.Kind == audit.KindNetRefused && strings.Contains(e.Decision.Rule, tc.rule) {
				found = true
			}
		}
		if !found {
			t.Errorf("%q: no refusal with rule %q in %v", tc.req, tc.rule, r.eventsSnapshot()[n:])
		}
	}
}

// rawExchange sends req from the guest to dst and returns whatever comes
// back before the connection ends ("" for a reset or an immediate close).
func (r *rig) rawExchange(t *testing.T, dst, req string) string {
	t.Helper()
	c, err := r.dialTCP(ctxT(t), dst)
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	defer c.Close()
	c.Write([]byte(req))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

// connectProxy is a forward proxy on loopback that answers CONNECT to
// allowed.test:443 with 200 and then echoes, refuses any other CONNECT
// with 403 but keeps the connection (as a lax proxy might), and answers
// other requests with the Host they named. It records what it was asked.
func connectProxy(t *testing.T) (addr string, seen func() []string) {
	var mu sync.Mutex
	var log []string
	ln := testutil.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		rd := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(rd)
			if err != nil {
				return
			}
			mu.Lock()
			log = append(log, req.Method+" "+req.RequestURI)
			mu.Unlock()
			if req.Method == "CONNECT" && req.RequestURI == "allowed.test:443" {
				c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
				io.Copy(c, rd)
				return
			}
			if req.Method == "CONNECT" {
				c.Write([]byte("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"))
				continue
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(req.Host), req.Host)
		}
	})
	return ln.Addr().String(), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), log...)
	}
}

func TestInspectConnectRelay(t *testing.T) {
	r, _ := inspectRig(t)
	proxy, seen := connectProxy(t)
	r.route("tcp", "203.0.113.10:3128", proxy)
	r.resolve(t, "proxy.test")
	// A CONNECT through the allowed proxy to a name the profile does not allow.
	req := "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n"
	if got := r.rawExchange(t, "203.0.113.10:3128", req); !gatewayRefusal(got) {
		t.Fatalf("CONNECT to a denied target reached the proxy: %q", got)
	}
	e := r.waitEvent("CONNECT refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused && e.Connect != "" })
	if e.Connect != "evil.test:443" || e.Decision.Rule != "default deny" || !strings.Contains(e.Decision.Reason, "CONNECT target") {
		t.Errorf("refusal = %+v", e)
	}
	// The proxy's own name is allowed only on 3128: a CONNECT to it on 22 is refused too.
	if got := r.rawExchange(t, "203.0.113.10:3128", "CONNECT api.broker.test:22 HTTP/1.1\r\n\r\n"); !gatewayRefusal(got) {
		t.Fatalf("CONNECT to a denied port: %q", got)
	}
	// An allowed target passes: the proxy's answer, then the tunnel (bytes
	// sent right after the CONNECT wait for the answer, then go through).
	req = "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\nearly\n"
	c, err := r.dialTCP(ctxT(t), "203.0.113.10:3128")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte(req))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	rd := bufio.NewReader(c)
	resp, err := http.ReadResponse(rd, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT to an allowed target: %v, %v", resp, err)
	}
	c.Write([]byte("later\n"))
	for _, want := range []string{"early\n", "later\n"} {
		if l, err := rd.ReadString('\n'); err != nil || l != want {
			t.Fatalf("through the tunnel: %q, %v; want %q", l, err, want)
		}
	}
	if got := strings.Join(seen(), "|"); got != "CONNECT allowed.test:443" {
		t.Errorf("the proxy was asked %q", got)
	}
}

// A proxy that refuses a CONNECT may read what follows as another request:
// after a refusal the gateway ends the connection, so nothing after it
// reaches the proxy unchecked.
func TestInspectConnectRefusedByProxy(t *testing.T) {
	r, _ := inspectRig(t, func(c *Config) {
		c.Policy = ProfilePolicy(mustProfile(t, "network:\n  allow:\n    - domain: proxy.test\n    - domain: allowed.test\n    - domain: nope.allowed.test\n"))
	})
	proxy, seen := connectProxy(t)
	r.route("tcp", "203.0.113.10:3128", proxy)
	r.resolve(t, "proxy.test")
	got := r.rawExchange(t, "203.0.113.10:3128",
		"CONNECT nope.allowed.test:443 HTTP/1.1\r\nHost: nope.allowed.test:443\r\n\r\nGET http://evil.test/ HTTP/1.1\r\nHost: evil.test\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 403") || strings.Contains(got, "evil.test") {
		t.Errorf("got %q", got)
	}
	if s := strings.Join(seen(), "|"); s != "CONNECT nope.allowed.test:443" {
		t.Errorf("the proxy was asked %q", s)
	}
}

func TestInspectMalformedAndSilent(t *testing.T) {
	r, _ := inspectRig(t, func(c *Config) { c.PeekTimeout = 300 * time.Millisecond })
	r.route("tcp", "203.0.113.5:443", tcpEcho(t))
	r.resolve(t, "allowed.test")
	for _, hello := range [][]byte{
		{0x16, 0x03, 0x01, 0x00, 0x05, 1, 0, 0, 1, 0xff},                                // ClientHello body too short
		{0x16, 0x03, 0x01, 0x00, 0x04, 2, 0, 0, 0},                                      // ServerHello from a client
		{0x16, 0x03, 0x01, 0x00, 0x00},                                                  // empty record
		{0x16, 0x07, 0x01, 0x00, 0x01, 1},                                               // bad version
		append([]byte{0x16, 0x03, 0x01, 0x00, 0x04, 1, 0, 0x40, 0}, make([]byte, 0)...), // truncated, then EOF
	} {
		n := len(r.eventsSnapshot())
		c, err := r.dialTCP(ctxT(t), "203.0.113.5:443")
		if err != nil {
			t.Fatal(err)
		}
		c.Write(hello)
		c.CloseWrite()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Errorf("hello %x was echoed: %x", hello, b)
		}
		c.Close()
		r.waitEvent("end of malformed flow", func(e Event) bool {
			return len(r.eventsSnapshot()) > n
		})
	}
	refusedWith(r, RuleMalformed)

	// A guest that sends nothing is closed after PeekTimeout.
	c, err := r.dialTCP(ctxT(t), "203.0.113.5:443")
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("silent flow: %v, want reset", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("silent flow closed after %v", d)
	}
	refusedWith(r, RuleSilent)

	// A protocol that names nothing is refused under a domain rule: it
	// could carry anything to anyone the address serves.
	c, err = r.dialTCP(ctxT(t), "203.0.113.5:443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("SSH-2.0-test\r\n"))
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if l, err := bufio.NewReader(c).ReadString('\n'); err == nil || isTimeout(err) {
		t.Fatalf("opaque protocol under a domain rule: %q, %v; want a reset", l, err)
	}
	if e := refusedWith(r, RuleUnnamed); !strings.Contains(e.Decision.Reason, "neither a TLS ClientHello nor an HTTP/1.x request") {
		t.Errorf("refusal = %+v", e)
	}
}

// upstreamTLS is an HTTPS server with a certificate for name from its own
// CA, returned as a root pool.
func upstreamTLS(t testing.TB, name string, h http.Handler) (addr string, roots *x509.CertPool) {
	t.Helper()
	uca, err := tlsgw.New("upstream")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := uca.Leaf(name)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	roots = x509.NewCertPool()
	roots.AddCert(uca.Cert())
	return strings.TrimPrefix(srv.URL, "https://"), roots
}

// guestHTTPS is an HTTPS client in the guest that trusts only roots and
// dials dst whatever the URL says.
func (r *rig) guestHTTPS(dst string, roots *x509.CertPool) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return r.dialTCP(ctx, dst) },
		TLSClientConfig: &tls.Config{RootCAs: roots, NextProtos: []string{"h2", "http/1.1"}}, // offers h2; the gateway must pick http/1.1
	}, Timeout: 10 * time.Second}
}

func TestBrokerInjectsCredential(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var seen []string
	addr, upRoots := upstreamTLS(t, "api.broker.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		if r.URL.Path == "/stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-release
			fmt.Fprint(w, "data: two\n\n")
			return
		}
		fmt.Fprintf(w, "auth=%s host=%s proto=%s", r.Header.Get("Authorization"), r.Host, r.Proto)
	}))
	r, ca := inspectRig(t, func(c *Config) { c.UpstreamRoots = upRoots })
	r.route("tcp", "203.0.113.9:443", addr)
	r.resolve(t, "api.broker.test")

	guestRoots := x509.NewCertPool()
	guestRoots.AppendCertsFromPEM(ca.CertPEM())
	cl := r.guestHTTPS("203.0.113.9:443", guestRoots)
	defer cl.CloseIdleConnections()
	for i := range 2 { // two requests on one keep-alive connection
		req, _ := http.NewRequest("GET", "https://api.broker.test/v1/models?key=q", nil)
		req.Header.Set("Authorization", "Bearer smx-placeholder")
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := "auth=Bearer " + testSecret + " host=api.broker.test proto=HTTP/1.1"; string(b) != want {
			t.Fatalf("upstream saw %q, want %q", b, want)
		}
		if resp.TLS == nil || resp.TLS.PeerCertificates[0].Issuer.CommonName != "smx sandbox CA test" || resp.TLS.NegotiatedProtocol != "http/1.1" {
			t.Errorf("guest TLS state: %+v", resp.TLS)
		}
	}

	// Streaming: the first event arrives before the upstream finishes.
	resp, err := cl.Get("https://api.broker.test/stream")
	if err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReader(resp.Body)
	got := make(chan string, 1)
	go func() { l, _ := rd.ReadString('\n'); got <- l }()
	select {
	case l := <-got:
		if l != "data: one\n" {
			t.Errorf("first event = %q", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the first event was held back")
	}
	close(release)
	rest, _ := io.ReadAll(rd)
	resp.Body.Close()
	if !strings.Contains(string(rest), "data: two") {
		t.Errorf("rest of stream = %q", rest)
	}

	// A request on the brokered connection naming another host is refused.
	req, _ := http.NewRequest("GET", "https://api.broker.test/", nil)
	req.Host = "evil.test"
	resp, err = cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("Host mismatch: %s", resp.Status)
	}
	refusedWith(r, RuleHostSNI)

	// A guest that trusts only the public roots does not accept the gateway's certificate.
	sys := r.guestHTTPS("203.0.113.9:443", nil)
	if _, err := sys.Get("https://api.broker.test/"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("guest without the sandbox CA: %v, want a certificate error", err)
	}
	sys.CloseIdleConnections()

	cl.CloseIdleConnections()
	uses := 0
	r.waitEvent("flow summary", func(e Event) bool { return e.Kind == audit.KindNetFlow && e.Credential == "api" && e.BytesIn > 0 })
	for _, e := range r.eventsSnapshot() {
		if strings.Contains(fmt.Sprint(e.Fields()), "s3cret") || strings.Contains(e.String(), "s3cret") || strings.Contains(fmt.Sprintf("%+v", e), "s3cret") {
			t.Errorf("event carries the secret: %+v", e)
		}
		if e.Kind == audit.KindCredUse {
			uses++
			f := e.Fields()
			if f["credential"] != "api" || f["secret"] != "api-key" || f["header"] != "Authorization" || f["host"] != "api.broker.test" ||
				f["method"] != "GET" || f["path"] == nil || strings.Contains(fmt.Sprint(f["path"]), "key=q") {
				t.Errorf("cred.use fields = %v", f)
			}
		}
	}
	if uses != 3 {
		t.Errorf("%d cred.use events, want 3", uses)
	}
	mu.Lock()
	for _, a := range seen {
		if a != "Bearer "+testSecret {
			t.Errorf("upstream saw Authorization %q", a)
		}
	}
	mu.Unlock()
}

func TestBrokerVerifiesUpstream(t *testing.T) {
	addr, _ := upstreamTLS(t, "api.broker.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("an unverified upstream got a request with %q", r.Header.Get("Authorization"))
	}))
	r, ca := inspectRig(t, func(c *Config) { c.UpstreamRoots = x509.NewCertPool() }) // trusts nothing
	r.route("tcp", "203.0.113.9:443", addr)
	r.resolve(t, "api.broker.test")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	cl := r.guestHTTPS("203.0.113.9:443", roots)
	defer cl.CloseIdleConnections()
	resp, err := cl.Get("https://api.broker.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("unverifiable upstream: %s", resp.Status)
	}
	e := r.waitEvent("upstream error", func(e Event) bool { return strings.Contains(e.Err, "upstream") })
	if !strings.Contains(e.Err, "certificate") {
		t.Errorf("event = %+v", e)
	}
}

func TestBrokerMissingSecret(t *testing.T) {
	r, ca := inspectRig(t)
	r.route("tcp", "203.0.113.11:443", tlsEchoServer(t))
	r.resolve(t, "nokey.broker.test")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	cl := r.guestHTTPS("203.0.113.11:443", roots)
	defer cl.CloseIdleConnections()
	if _, err := cl.Get("https://nokey.broker.test/"); err == nil {
		t.Fatal("request with a missing secret went through")
	}
	e := refusedWith(r, RuleNoSecret)
	if e.Credential != "nokey" || e.Secret != "absent-key" || !strings.Contains(e.Decision.Reason, "absent-key") {
		t.Errorf("refusal = %+v", e)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.dialed {
		if strings.Contains(d, "203.0.113.11") {
			t.Errorf("upstream dialled without a secret: %v", r.dialed)
		}
	}
}
