package netstack

import (
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/audit"
)

// gatewayRefusal reports whether got is the gateway's own 403 for a
// refused plain-HTTP request (not an upstream's answer).
func gatewayRefusal(got string) bool {
	return strings.HasPrefix(got, "HTTP/1.1 403 Forbidden\r\n") &&
		strings.Contains(got, "refused by the sandbox's network profile: rule ") &&
		strings.Contains(got, "do not retry or work around it")
}

// TestDeniedHTTPGets403: the first plain-HTTP request of a flow the
// profile refuses is answered 403 with the rule and a hint, not reset,
// and never reaches the destination; the refusal is logged. Adversarial:
// a raw IP no rule allows, the same with a Host header naming an allowed
// domain, a Host header naming a denied domain on an allowed flow, and
// bytes that are not HTTP (reset, as before).
func TestDeniedHTTPGets403(t *testing.T) {
	r, _ := inspectRig(t)
	up := newCountingHTTP(t)
	r.route("tcp", "192.0.2.1:80", up.addr)   // reachable, no rule allows it
	r.route("tcp", "203.0.113.5:80", up.addr) // allowed.test
	r.resolve(t, "allowed.test")

	for _, c := range []struct{ name, dst, req, host, rule string }{
		{"raw IP", "192.0.2.1:80", "GET /x HTTP/1.1\r\nHost: 192.0.2.1\r\n\r\n", `"192.0.2.1"`, "default deny"},
		{"raw IP, Host an allowed name", "192.0.2.1:80", "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", `"allowed.test"`, "default deny"},
		{"raw IP, body", "192.0.2.1:80", "POST / HTTP/1.1\r\nHost: 192.0.2.1\r\nContent-Length: 5\r\n\r\nhello", `"192.0.2.1"`, "default deny"},
		{"Host mismatch", "203.0.113.5:80", "GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", `"evil.test"`, "default deny"},
	} {
		n := len(r.eventsSnapshot())
		got := r.rawExchange(t, c.dst, c.req)
		if !gatewayRefusal(got) || !strings.Contains(got, "smx: request for "+c.host) || !strings.Contains(got, "rule "+c.rule) {
			t.Errorf("%s: answer %q, want the gateway's 403 naming %s and rule %s", c.name, got, c.host, c.rule)
		}
		r.waitEvent(c.name+" refusal", func(e Event) bool {
			return len(r.eventsSnapshot()) > n && e.Kind == audit.KindNetRefused && e.Flow.Dst.String() == c.dst && e.Decision.Rule == c.rule
		})
	}
	for _, h := range []string{"192.0.2.1", "evil.test"} {
		if n := up.requests(h); n != 0 {
			t.Errorf("the upstream served %d requests for %s", n, h)
		}
	}
	if n := up.requests("allowed.test"); n != 0 {
		t.Errorf("a request to the denied IP naming allowed.test reached the upstream (%d)", n)
	}
	// Not HTTP: reset, as every other refused flow.
	if got := r.rawExchange(t, "192.0.2.1:80", "\x00\x01binary\r\n\r\n"); got != "" {
		t.Errorf("non-HTTP bytes to a refused flow got %q", got)
	}
}
