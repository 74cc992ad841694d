package netstack

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A guest client that does not trust the sandbox CA gives up on a brokered
// connection during the handshake, or right after it without a request:
// either is recorded as a refusal naming the likely cause and the fix. A
// client that trusts the CA and makes its request is not.
func TestBrokerUntrustedCA(t *testing.T) {
	addr, upRoots := upstreamTLS(t, "api.broker.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	r, ca := inspectRig(t, func(c *Config) { c.UpstreamRoots = upRoots })
	r.route("tcp", "203.0.113.9:443", addr)
	r.resolve(t, "api.broker.test")
	untrusted := func() int {
		n := 0
		for _, e := range r.eventsSnapshot() {
			if e.Decision.Rule == RuleUntrustedCA {
				n++
			}
		}
		return n
	}

	// Trusted: no such record.
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	cl := r.guestHTTPS("203.0.113.9:443", roots)
	resp, err := cl.Get("https://api.broker.test/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cl.CloseIdleConnections()

	// Untrusted: the client's alert ends the handshake.
	if _, err := r.guestHTTPS("203.0.113.9:443", x509.NewCertPool()).Get("https://api.broker.test/"); err == nil {
		t.Fatal("a client trusting nothing accepted the gateway's certificate")
	}
	e := refusedWith(r, RuleUntrustedCA)
	if e.SNI != "api.broker.test" || !strings.Contains(e.Decision.Reason, "NODE_EXTRA_CA_CERTS") ||
		!strings.Contains(e.Decision.Reason, "TLS handshake") {
		t.Errorf("refusal = %+v", e)
	}

	// A client that completes the handshake and then leaves.
	before := untrusted()
	c, err := r.dialTCP(ctxT(t), "203.0.113.9:443")
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "api.broker.test", InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	tc.Close()
	for end := time.Now().Add(5 * time.Second); untrusted() == before; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no refusal for a client that left after the handshake")
		}
	}
	if got := untrusted(); got != before+1 {
		t.Errorf("%d untrusted-CA records, want %d (the trusted request made none)", got, before+1)
	}
}
