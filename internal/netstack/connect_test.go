package netstack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/testutil"
)

// rawProxy is a forward proxy on loopback that records each request head
// byte for byte (request line, then headers as sent), answers a GET with
// 200 and a CONNECT with 200, then echoes the tunnel.
func rawProxy(t *testing.T) (addr string, heads func() []string) {
	var mu sync.Mutex
	var log []string
	ln := testutil.ServeTCP(t, func(c net.Conn) {
		defer c.Close()
		tp := textproto.NewReader(bufio.NewReader(c))
		for {
			line, err := tp.ReadLine()
			if err != nil {
				return
			}
			hdr, err := tp.ReadMIMEHeader()
			if err != nil {
				return
			}
			mu.Lock()
			log = append(log, line+" | Host: "+strings.Join(hdr.Values("Host"), ","))
			mu.Unlock()
			if strings.HasPrefix(line, "CONNECT ") {
				c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
				io.Copy(c, tp.R)
				return
			}
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	})
	return ln.Addr().String(), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), log...)
	}
}

// TestConnectTargetAsDecided: a CONNECT later on a kept-alive connection
// to an allowed proxy reaches the proxy only in the form the gateway
// decided: host:port, lower case. A target the proxy could read
// differently from the gateway (userinfo, where net/http takes the host
// after the @ and a lax proxy the one before it; an origin-form target
// whose host comes from the Host header; a trailing dot; a zone id; a
// port with a leading zero) is refused with a net.refused record and
// never reaches the proxy.
func TestConnectTargetAsDecided(t *testing.T) {
	r, _ := inspectRig(t)
	proxy, heads := rawProxy(t)
	r.route("tcp", "203.0.113.10:3128", proxy)
	r.resolve(t, "proxy.test")

	// exchange sends a GET the profile allows, then connect; it returns
	// the answer to the CONNECT.
	exchange := func(connect string) string {
		c, err := r.dialTCP(ctxT(t), "203.0.113.10:3128")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		rd := bufio.NewReader(c)
		c.Write([]byte("GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n"))
		resp, err := http.ReadResponse(rd, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET through the proxy: %v, %v", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		c.Write([]byte(connect))
		resp, err = http.ReadResponse(rd, &http.Request{Method: "CONNECT"})
		if err != nil {
			return "error: " + err.Error()
		}
		if resp.StatusCode == 200 {
			return resp.Status // a tunnel: no body to wait for
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.Status + "\n" + string(b)
	}

	for _, tc := range []struct{ name, req string }{
		{"userinfo naming another host", "CONNECT evil.test:443@allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n"},
		{"userinfo", "CONNECT user@allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n"},
		{"origin-form target", "CONNECT /evil.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n"},
		{"trailing dot", "CONNECT allowed.test.:443 HTTP/1.1\r\nHost: allowed.test.:443\r\n\r\n"},
		{"leading zero in port", "CONNECT allowed.test:0443 HTTP/1.1\r\nHost: allowed.test:0443\r\n\r\n"},
		{"IPv6 zone id", "CONNECT [2001:db8::1%25eth0]:443 HTTP/1.1\r\n\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := len(r.eventsSnapshot())
			before := len(heads())
			got := exchange(tc.req)
			if !strings.HasPrefix(got, "403") || !strings.Contains(got, "refused by the sandbox's network profile") {
				t.Errorf("CONNECT answered %q, want the gateway's 403", got)
			}
			if h := heads(); len(h) != before+1 {
				t.Errorf("the proxy received %q after the GET", h[before+1:])
			}
			e := r.waitEventAfter(t, n, "CONNECT refusal", func(e Event) bool {
				return e.Kind == audit.KindNetRefused && e.Connect != ""
			})
			if e.Decision.Rule != RuleMalformed || !strings.Contains(e.Decision.Reason, "HTTP CONNECT target") {
				t.Errorf("refusal = %+v", e.Fields())
			}
			t.Logf("refusal record: %v", e.Fields())
		})
	}

	// An allowed target goes on as host:port, as decided.
	before := len(heads())
	if got := exchange("CONNECT ALLOWED.test:443 HTTP/1.1\r\nHost: ALLOWED.test:443\r\n\r\n"); !strings.HasPrefix(got, "200") {
		t.Fatalf("allowed CONNECT answered %q", got)
	}
	h := heads()
	if len(h) != before+2 || h[before+1] != "CONNECT allowed.test:443 HTTP/1.1 | Host: allowed.test:443" {
		t.Errorf("the proxy received %q, want the CONNECT as decided", h[before:])
	}
}

func TestConnectTargetParse(t *testing.T) {
	for _, tc := range []struct{ in, target string }{
		{"example.com:443", "example.com:443"},
		{"Example.COM:443", "example.com:443"},
		{"203.0.113.5:80", "203.0.113.5:80"},
		{"[2001:db8::1]:443", "[2001:db8::1]:443"},
		{"[::ffff:203.0.113.5]:443", "203.0.113.5:443"},
		{"a_b.example:1", "a_b.example:1"},
		{"user@example.com:443", ""},
		{"a.com:443@b.com:443", ""},
		{"http://example.com:443", ""},
		{"example.com:443/x", ""},
		{"/example.com:443", ""},
		{"example.com.:443", ""},
		{"example.com:0443", ""},
		{"example.com:+443", ""},
		{"example.com:0", ""},
		{"example.com:65536", ""},
		{"example.com", ""},
		{"2001:db8::1:443", ""},
		{"[fe80::1%eth0]:443", ""},
		{"[fe80::1%25eth0]:443", ""},
		{"[203.0.113.5]:443", ""},
		{"2130706433:80", ""},
		{"127.1:80", ""},
		{"0177.0.0.1:80", ""},
		{"exa mple.com:443", ""},
		{"-x.example:443", ""},
		{"ex%61mple.com:443", ""},
		{"xn--bcher-kva.example:443", "xn--bcher-kva.example:443"},
		{"bücher.example:443", ""},
	} {
		_, _, target, why := connectTarget(tc.in)
		if target != tc.target || (target == "") != (why != "") {
			t.Errorf("connectTarget(%q) = %q, %q; want %q", tc.in, target, why, tc.target)
		}
	}
}

// waitEventAfter waits for an event matching ok among those after the
// first n.
func (r *rig) waitEventAfter(t testing.TB, n int, what string, ok func(Event) bool) Event {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range r.eventsSnapshot()[n:] {
			if ok(e) {
				return e
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no event: %s; have %v", what, r.eventsSnapshot()[n:])
	return Event{}
}
