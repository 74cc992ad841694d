package netstack

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/audit"
)

// Attacks an earlier review found getting past domain rules, each against
// an upstream that counts what reaches it: a leak is seen, not inferred.

// countingHTTP is an HTTP server on loopback that answers "hello HOST" and
// counts connections and requests per Host.
type countingHTTP struct {
	addr  string
	conns atomic.Int64
	mu    sync.Mutex
	hosts map[string]int
}

func newCountingHTTP(t *testing.T) *countingHTTP {
	c := &countingHTTP{hosts: map[string]int{}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.hosts[r.Host]++
		c.mu.Unlock()
		fmt.Fprintf(w, "hello %s", r.Host)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			c.conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c.addr = strings.TrimPrefix(srv.URL, "http://")
	return c
}

func (c *countingHTTP) requests(host string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hosts[host]
}

// keepAliveGet sends one GET naming host on c and reads the response.
func keepAliveGet(c net.Conn, rd *bufio.Reader, host string) (string, error) {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(rd, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s", resp.Status)
	}
	return string(b), err
}

// Leak 1: empty lines before the request line. Servers skip them, so the
// request after them is what must be decided.
func TestLeadingEmptyLines(t *testing.T) {
	r, _ := inspectRig(t)
	up := newCountingHTTP(t)
	r.route("tcp", "203.0.113.5:80", up.addr)
	r.route("tcp", "203.0.113.10:3128", up.addr)
	r.resolve(t, "allowed.test")
	r.resolve(t, "proxy.test")
	for _, c := range []struct{ dst, req, field string }{
		{"203.0.113.5:80", "\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n", "http_host"},
		{"203.0.113.5:80", "\r\n\r\n\nGET http://other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "http_host"},
		{"203.0.113.10:3128", "\r\nCONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n", "connect"},
	} {
		n := len(r.eventsSnapshot())
		if got := r.rawExchange(t, c.dst, c.req); !gatewayRefusal(got) {
			t.Errorf("%q got an answer other than the gateway's 403: %q", c.req, got)
		}
		e := r.waitEvent("refusal", func(e Event) bool {
			return len(r.eventsSnapshot()) > n && e.Kind == audit.KindNetRefused && e.Fields()[c.field] != nil
		})
		if !strings.Contains(fmt.Sprint(e.Fields()[c.field]), "other.test") || e.Decision.Rule != "default deny" {
			t.Errorf("%q: refusal %+v", c.req, e)
		}
	}
	if n := up.conns.Load(); n != 0 {
		t.Errorf("the upstream received %d connections", n)
	}
	// The same prefix before an allowed request is harmless and passes.
	if got := r.rawExchange(t, "203.0.113.5:80", "\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"); !strings.Contains(got, "hello allowed.test") {
		t.Errorf("allowed request after an empty line: %q", got)
	}
}

// Leak 5: every request on a keep-alive connection is decided, and the
// host recorded is the one decided on.
func TestKeepAliveEveryRequest(t *testing.T) {
	r, _ := inspectRig(t)
	up := newCountingHTTP(t)
	r.route("tcp", "203.0.113.5:80", up.addr)
	r.resolve(t, "allowed.test")
	c, err := r.dialTCP(ctxT(t), "203.0.113.5:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	for i := 0; i < 2; i++ {
		if body, err := keepAliveGet(c, rd, "allowed.test"); err != nil || body != "hello allowed.test" {
			t.Fatalf("request %d: %q, %v", i, body, err)
		}
	}
	if body, err := keepAliveGet(c, rd, "other.test"); err == nil || !strings.Contains(body, `"other.test" refused`) {
		t.Fatalf("a later request naming other.test got %q, %v; want 403", body, err)
	}
	e := r.waitEvent("refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused && e.HTTPHost != "" })
	if e.HTTPHost != "other.test" || e.Method != "GET" || e.Path != "/" || !strings.Contains(e.Decision.Reason, `HTTP Host "other.test"`) {
		t.Errorf("refusal = %+v", e)
	}
	if n := up.requests("other.test"); n != 0 {
		t.Errorf("the upstream served %d requests for other.test", n)
	}
	if n := up.requests("allowed.test"); n != 2 {
		t.Errorf("the upstream served %d requests for allowed.test, want 2", n)
	}
	// Userinfo in an absolute-form target: the name decided on (and
	// recorded) is the authority's host, not what precedes the @.
	got := r.rawExchange(t, "203.0.113.5:80", "GET http://allowed.test@other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	if !gatewayRefusal(got) {
		t.Errorf("userinfo trick got %q", got)
	}
	e = r.waitEvent("userinfo refusal", func(e Event) bool {
		return e.Kind == audit.KindNetRefused && strings.Contains(e.Decision.Reason, "@") == false && e.HTTPHost == "other.test" && e.Method == ""
	})
	if !strings.Contains(e.Decision.Reason, `"other.test"`) {
		t.Errorf("refusal = %+v", e)
	}
	if n := up.requests("other.test"); n != 0 {
		t.Errorf("the upstream served %d requests for other.test", n)
	}
}

// Pipelined requests from a client that half-closes after sending them
// (nc, HTTP/1.0 tools): the allowed one is answered, the other refused.
func TestKeepAlivePipelinedHalfClose(t *testing.T) {
	r, _ := inspectRig(t)
	up := newCountingHTTP(t)
	r.route("tcp", "203.0.113.5:80", up.addr)
	r.resolve(t, "allowed.test")
	c, err := r.dialTCP(ctxT(t), "203.0.113.5:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n"))
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	if !strings.Contains(string(b), "hello allowed.test") || !strings.Contains(string(b), "403 Forbidden") {
		t.Errorf("got %q", b)
	}
	if up.requests("other.test") != 0 || up.requests("allowed.test") != 1 {
		t.Errorf("upstream saw %v", up.hosts)
	}
}

// Leak 3: a policy change decides live flows again with the names their
// bytes carried, not only the name DNS gave their address.
func TestReevaluateRechecksNames(t *testing.T) {
	r := newRig(t, func(c *Config) {
		c.Policy = ProfilePolicy(mustProfile(t, "network:\n  allow:\n    - domain: allowed.test\n    - domain: \"*.wild.test\"\n"))
	})
	up := newCountingHTTP(t)
	r.route("tcp", "203.0.113.5:80", up.addr)
	r.route("tcp", "203.0.113.5:443", tlsEchoServer(t))
	r.resolve(t, "allowed.test")
	c, err := r.dialTCP(ctxT(t), "203.0.113.5:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	if body, err := keepAliveGet(c, rd, "a.wild.test"); err != nil || body != "hello a.wild.test" {
		t.Fatalf("GET a.wild.test on allowed.test's address: %q, %v", body, err)
	}
	tc, err := r.dialTCP(ctxT(t), "203.0.113.5:443")
	if err != nil {
		t.Fatal(err)
	}
	tlc := tlsClient(tc, "b.wild.test")
	if err := tlc.Handshake(); err != nil {
		t.Fatalf("TLS naming b.wild.test: %v", err)
	}
	defer tlc.Close()
	// Narrowed: the DNS name is still allowed, what the flows named is not.
	r.s.SetPolicy(ProfilePolicy(mustProfile(t, "network:\n  allow:\n    - domain: allowed.test\n")))
	if n := r.s.Reevaluate(); n != 2 {
		t.Errorf("Reevaluate closed %d flows, want 2", n)
	}
	if _, err := keepAliveGet(c, rd, "a.wild.test"); err == nil {
		t.Errorf("the HTTP flow that named a.wild.test survived the change")
	}
	tlc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := tlc.Write([]byte("GET / HTTP/1.1\r\nHost: b.wild.test\r\n\r\n")); err == nil {
		if _, err := tlc.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Errorf("the TLS flow that named b.wild.test survived the change: %v", err)
		}
	}
	for _, want := range []func(Event) bool{
		func(e Event) bool { return e.HTTPHost == "a.wild.test" },
		func(e Event) bool { return e.SNI == "b.wild.test" },
	} {
		e := r.waitEvent("revocation", func(e Event) bool {
			return e.Kind == audit.KindNetRefused && strings.HasPrefix(e.Decision.Reason, "policy changed") && want(e)
		})
		if e.Decision.Rule != "default deny" {
			t.Errorf("revocation = %+v", e)
		}
	}
	if n := up.requests("a.wild.test"); n != 1 {
		t.Errorf("upstream saw %d requests for a.wild.test, want 1", n)
	}
}

// Leak 4: UDP on a name allowed only by a domain rule without proto: udp.
func TestUDPOnDomainRule(t *testing.T) {
	r := newRig(t, func(c *Config) {
		c.Policy = ProfilePolicy(mustProfile(t, "network:\n  allow:\n    - domain: allowed.test\n    - domain: \"*.wild.test\"\n      proto: udp\n"))
	})
	var got atomic.Int64
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			got.Add(1)
			pc.WriteTo(buf[:n], a)
		}
	}()
	r.route("udp", "203.0.113.5:443", pc.LocalAddr().String())
	r.route("udp", "203.0.113.6:443", pc.LocalAddr().String())
	r.resolve(t, "allowed.test")
	r.resolve(t, "a.wild.test")
	u := r.dialUDP("203.0.113.5:443")
	u.Write([]byte("quic-initial"))
	e := r.waitEvent("udp refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused && e.Flow.Proto == ProtoUDP })
	if !strings.Contains(e.Decision.Rule, "network.allow[0] domain allowed.test") || !strings.Contains(e.Decision.Reason, "proto: udp") {
		t.Errorf("refusal = %+v", e)
	}
	u.Close()
	// With proto: udp the rule opens UDP.
	w := r.dialUDP("203.0.113.6:443")
	defer w.Close()
	w.Write([]byte("ping"))
	w.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	if n, err := w.Read(buf); err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("UDP under proto: udp: %q, %v", buf[:n], err)
	}
	if n := got.Load(); n != 1 {
		t.Errorf("the upstream received %d datagrams, want 1 (only the proto: udp one)", n)
	}
}

// Leak 2: an address of the host itself is closed like loopback, even
// when a rule names it.
func TestHostAddressClosed(t *testing.T) {
	var own netip.Addr
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() && !ip.IsLoopback() {
				own = ip.Unmap()
				break
			}
		}
	}
	if !own.IsValid() {
		t.Skip("the host has no non-loopback IPv4 address")
	}
	if !isHostAddr(own) || isHostAddr(netip.MustParseAddr("203.0.113.77")) {
		t.Fatalf("isHostAddr(%v) = %v, isHostAddr(203.0.113.77) = %v", own, isHostAddr(own), isHostAddr(netip.MustParseAddr("203.0.113.77")))
	}
	r := newRig(t, func(c *Config) {
		c.Policy = ProfilePolicy(mustProfile(t, "network:\n  mode: allow-all\n  allow:\n    - cidr: "+own.String()+"/32\n"))
	})
	if _, err := r.dialTCP(ctxT(t), own.String()+":22"); !isRefused(err) {
		t.Fatalf("dial the host's own address %v: %v, want refused", own, err)
	}
	e := refusedWith(r, RuleHostAddr)
	if !strings.Contains(e.Decision.Reason, "host.smx.internal") {
		t.Errorf("refusal = %+v", e)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.dialed) != 0 {
		t.Errorf("dialled %v", r.dialed)
	}
}

func tlsClient(c net.Conn, sni string) *tls.Conn {
	return tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
}

// Requests after the first keep their form: an absolute-form request (to
// a forward proxy) stays absolute, and an Upgrade (WebSocket) becomes a
// tunnel once the upstream agrees.
func TestKeepAliveProxyFormsAndUpgrade(t *testing.T) {
	r, _ := inspectRig(t)
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		mu.Lock()
		seen = append(seen, req.RequestURI+" "+req.Host)
		mu.Unlock()
		if req.Header.Get("Upgrade") == "echo" {
			c, brw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			line, _ := brw.ReadString('\n')
			c.Write([]byte("echo " + line))
			return
		}
		fmt.Fprintf(w, "hello %s", req.Host)
	}))
	t.Cleanup(srv.Close)
	r.route("tcp", "203.0.113.10:3128", strings.TrimPrefix(srv.URL, "http://"))
	r.resolve(t, "proxy.test")
	c, err := r.dialTCP(ctxT(t), "203.0.113.10:3128")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	for _, req := range []string{
		"GET http://allowed.test/a HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http://user:pw@allowed.test/b HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
	} {
		c.Write([]byte(req))
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%q: %s", req, resp.Status)
		}
	}
	c.Write([]byte("GET /ws HTTP/1.1\r\nHost: proxy.test:3128\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n"))
	resp, err := http.ReadResponse(rd, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	c.Write([]byte("ping\n"))
	if l, err := rd.ReadString('\n'); err != nil || l != "echo ping\n" {
		t.Fatalf("after the upgrade: %q, %v", l, err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := "http://allowed.test/a allowed.test|http://allowed.test/b allowed.test|/ws proxy.test:3128"
	if got := strings.Join(seen, "|"); got != want {
		t.Errorf("upstream saw %q, want %q", got, want)
	}
}
