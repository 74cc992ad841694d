package netstack

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func httpServer(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.Host)
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// guestGet does an HTTP GET from the guest to dst (IP:PORT), with host as
// the Host header.
func (r *rig) guestGet(t *testing.T, dst, host string) (string, error) {
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return r.dialTCP(ctx, dst) },
	}, Timeout: 10 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + host + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestAllowedTCPByCIDR(t *testing.T) {
	r := newRig(t)
	r.route("tcp", "198.51.100.10:80", httpServer(t))
	body, err := r.guestGet(t, "198.51.100.10:80", "example.test")
	if err != nil || body != "hello example.test" {
		t.Fatalf("GET = %q, %v", body, err)
	}
	e := r.waitEvent("flow summary", func(e Event) bool { return e.Kind == audit.KindNetFlow })
	if e.Flow.Dst.String() != "198.51.100.10:80" || e.Flow.Host != "" || e.BytesOut == 0 || e.BytesIn == 0 || e.Err != "" ||
		!strings.Contains(e.Decision.Rule, "network.allow[2]") {
		t.Errorf("summary = %+v", e)
	}
	if f := e.Fields(); f["bytes_in"] != e.BytesIn || f["dst"] != "198.51.100.10:80" {
		t.Errorf("fields = %v", f)
	}
}

func TestDeniedTCPGetsRST(t *testing.T) {
	r := newRig(t)
	// Not port 80 (where a refused flow is told why in HTTP: TestDeniedHTTPGets403).
	r.route("tcp", "192.0.2.1:443", httpServer(t)) // reachable, but no rule allows it
	_, err := r.dialTCP(ctxT(t), "192.0.2.1:443")
	if !isRefused(err) {
		t.Fatalf("dial denied destination: %v, want connection refused", err)
	}
	e := r.waitEvent("refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused })
	if e.Decision.Rule != "default deny" || e.Flow.Dst.String() != "192.0.2.1:443" {
		t.Errorf("refusal = %+v", e)
	}
	if slices.ContainsFunc(r.dialed, func(s string) bool { return strings.Contains(s, "192.0.2.1") }) {
		t.Errorf("denied destination was dialled: %v", r.dialed)
	}
}

func TestUpstreamDownGetsRST(t *testing.T) {
	r := newRig(t)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()
	r.route("tcp", "198.51.100.11:80", dead)
	_, err := r.dialTCP(ctxT(t), "198.51.100.11:80")
	if !isRefused(err) {
		t.Fatalf("dial with upstream down: %v, want connection refused", err)
	}
	e := r.waitEvent("failed flow", func(e Event) bool { return e.Kind == audit.KindNetFlow })
	if !strings.Contains(e.Err, "dial") {
		t.Errorf("event = %+v", e)
	}
}

func TestDNSAndNameMapping(t *testing.T) {
	r := newRig(t)
	r.route("tcp", "203.0.113.5:80", httpServer(t))

	// Before any lookup, 203.0.113.5 is a raw IP no CIDR rule opens.
	if got := r.rawExchange(t, "203.0.113.5:80", "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n"); !gatewayRefusal(got) {
		t.Fatalf("raw IP before lookup: %q, want the gateway's 403", got)
	}

	for _, overTCP := range []bool{false, true} {
		m, err := r.query("Allowed.Test", dns.TypeA, overTCP)
		if err != nil {
			t.Fatal(err)
		}
		if m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != "203.0.113.5" {
			t.Fatalf("A allowed.test (tcp=%v) = %v", overTCP, m)
		}
	}
	// IPv6 is off: AAAA is answered empty, without a lookup.
	if m, err := r.query("allowed.test", dns.TypeAAAA, false); err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
		t.Fatalf("AAAA = %v, %v", m, err)
	}

	body, err := r.guestGet(t, "203.0.113.5:80", "allowed.test")
	if err != nil || body != "hello allowed.test" {
		t.Fatalf("GET after lookup = %q, %v", body, err)
	}
	e := r.waitEvent("flow", func(e Event) bool { return e.Kind == audit.KindNetFlow })
	if e.Flow.Host != "allowed.test" || !strings.Contains(e.Decision.Rule, "network.allow[0]") {
		t.Errorf("flow = %+v", e)
	}
	// The name's rule allows port 80 only.
	if _, err := r.dialTCP(ctxT(t), "203.0.113.5:443"); !isRefused(err) {
		t.Fatalf("port 443 of an allowed name: %v, want refused", err)
	}

	// An unlisted name: NXDOMAIN, a refusal, and the host resolver is never asked.
	m, err := r.query("unlisted.test", dns.TypeA, false)
	if err != nil || m.Rcode != dns.RcodeNameError {
		t.Fatalf("unlisted = %v, %v", m, err)
	}
	e = r.waitEvent("dns refusal", func(e Event) bool {
		return e.Kind == audit.KindNetRefused && e.Flow.Proto == ProtoDNS && e.Flow.Host == "unlisted.test"
	})
	if e.Decision.Rule != "default deny" {
		t.Errorf("dns refusal = %+v", e)
	}
	r.mu.Lock()
	n := r.lookup["unlisted.test"]
	r.mu.Unlock()
	if n != 0 {
		t.Errorf("the host resolver was asked for a denied name %d times", n)
	}

	// Wildcard: a.wild.test resolves, blocked.wild.test (deny rule) does not.
	if m, _ := r.query("a.wild.test", dns.TypeA, false); m == nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 1 {
		t.Errorf("a.wild.test = %v", m)
	}
	if m, _ := r.query("blocked.wild.test", dns.TypeA, false); m == nil || m.Rcode != dns.RcodeNameError {
		t.Errorf("blocked.wild.test = %v", m)
	}
	// A name allowed but absent from the resolver's table.
	if m, _ := r.query("nothere.wild.test", dns.TypeA, false); m == nil || m.Rcode != dns.RcodeNameError {
		t.Errorf("nothere.wild.test = %v", m)
	}
	// ... is logged as unresolved, with the rule that allowed it.
	e = r.waitEvent("unresolved", func(e Event) bool {
		return e.Kind == audit.KindNetUnresolved && e.Flow.Host == "nothere.wild.test"
	})
	if !strings.Contains(e.Decision.Rule, "network.allow") || e.Err == "" {
		t.Errorf("unresolved = %+v", e)
	}
	// TXT of an allowed name: empty, no data channel.
	if m, _ := r.query("allowed.test", dns.TypeTXT, false); m == nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
		t.Errorf("TXT = %v", m)
	}
}

func TestOtherResolverRefused(t *testing.T) {
	r := newRig(t)
	c := r.dialUDP("8.8.8.8:53")
	defer c.Close()
	c.Write([]byte("query"))
	e := r.waitEvent("other resolver", func(e Event) bool { return e.Decision.Rule == RuleOtherResolver })
	if e.Flow.Proto != ProtoUDP || e.Flow.Dst.String() != "8.8.8.8:53" {
		t.Errorf("event = %+v", e)
	}
	if _, err := r.dialTCP(ctxT(t), "1.1.1.1:853"); !isRefused(err) {
		t.Fatalf("DoT: %v, want refused", err)
	}
	r.waitEvent("DoT refused", func(e Event) bool { return e.Decision.Rule == RuleOtherResolver && e.Flow.Proto == ProtoTCP })
	// Even a profile that allows everything does not open other resolvers.
	r.s.SetPolicy(ProfilePolicy(mustProfile(t, "network: {mode: allow-all}\n")))
	if _, err := r.dialTCP(ctxT(t), "9.9.9.9:53"); !isRefused(err) {
		t.Fatalf("TCP 53 under allow-all: %v, want refused", err)
	}
}

func TestHostPorts(t *testing.T) {
	echo := tcpEcho(t)
	_, port, _ := net.SplitHostPort(echo)
	var hp uint16
	fmt.Sscan(port, &hp)
	r := newRig(t, func(c *Config) { c.HostPorts = map[uint16]uint16{8080: hp, 9090: hp} })

	m, err := r.query("host.smx.internal", dns.TypeA, false)
	if err != nil || len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != "10.0.2.2" {
		t.Fatalf("host.smx.internal = %v, %v", m, err)
	}
	c, err := r.dialTCP(ctxT(t), "10.0.2.2:8080")
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("ping\n"))
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil || line != "ping\n" {
		t.Fatalf("echo via host port = %q, %v", line, err)
	}
	// 9090 is mapped in Config but not in the profile's host_ports.
	if _, err := r.dialTCP(ctxT(t), "10.0.2.2:9090"); !isRefused(err) {
		t.Fatalf("host port outside profile: %v, want refused", err)
	}
	r.waitEvent("9090 refused", func(e Event) bool {
		return e.Kind == audit.KindNetRefused && e.Flow.Host == HostInternal && e.Flow.Dst.Port() == 9090
	})
	// Unmapped gateway ports are closed.
	if _, err := r.dialTCP(ctxT(t), "10.0.2.2:22"); !isRefused(err) {
		t.Fatalf("gateway port 22: %v, want refused", err)
	}
	// 127.0.0.1 from the guest is the guest's own loopback, never the
	// host's; and a public-looking address never reaches host loopback
	// either, because only HostPorts dial 127.0.0.1.
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.dialed {
		if d != "tcp 127.0.0.1:"+port {
			t.Errorf("unexpected dial %q", d)
		}
	}
}

func TestUDPEcho(t *testing.T) {
	r := newRig(t)
	r.route("udp", "198.51.100.10:7", udpEcho(t))
	c := r.dialUDP("198.51.100.10:7")
	defer c.Close()
	for i := range 3 {
		msg := fmt.Sprintf("ping %d", i)
		c.Write([]byte(msg))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 100)
		n, err := c.Read(buf)
		if err != nil || string(buf[:n]) != msg {
			t.Fatalf("echo %d = %q, %v", i, buf[:n], err)
		}
	}
	// Denied UDP destination: dropped and logged once however often it is tried.
	d := r.dialUDP("192.0.2.1:7")
	defer d.Close()
	for range 5 {
		d.Write([]byte("x"))
	}
	r.waitEvent("udp refusal", func(e Event) bool { return e.Kind == audit.KindNetRefused && e.Flow.Dst.String() == "192.0.2.1:7" })
	time.Sleep(100 * time.Millisecond)
	n := 0
	for _, e := range r.eventsSnapshot() {
		if e.Flow.Dst.String() == "192.0.2.1:7" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d refusal events for one denied session, want 1", n)
	}
}

func TestUDPIdleTimeout(t *testing.T) {
	r := newRig(t, func(c *Config) { c.UDPIdleTimeout = 200 * time.Millisecond })
	r.route("udp", "198.51.100.10:7", udpEcho(t))
	c := r.dialUDP("198.51.100.10:7")
	defer c.Close()
	c.Write([]byte("x"))
	e := r.waitEvent("udp summary", func(e Event) bool { return e.Kind == audit.KindNetFlow && e.Flow.Proto == ProtoUDP })
	if e.BytesOut != 1 || e.BytesIn != 1 {
		t.Errorf("summary = %+v", e)
	}
	if n := r.s.Stats().Flows; n != 0 {
		t.Errorf("%d flows live after idle timeout", n)
	}
}

func TestUDPRateLimit(t *testing.T) {
	r := newRig(t, func(c *Config) { c.UDPRate = 100; c.RateLogInterval = 100 * time.Millisecond })
	r.route("udp", "198.51.100.10:9", udpEcho(t))
	c := r.dialUDP("198.51.100.10:9")
	defer c.Close()
	// Resolve the gateway's MAC first: the guest stack queues only 256
	// packets while it waits for ARP.
	r.query("allowed.test", dns.TypeA, false)
	start := time.Now()
	for range 1000 {
		c.Write([]byte("flood"))
	}
	elapsed := time.Since(start)
	replies := 0
	buf := make([]byte, 100)
	for {
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			break
		}
		replies++
	}
	r.waitEvent("rate limit", func(e Event) bool { return e.Decision.Rule == RuleUDPRate })
	time.Sleep(200 * time.Millisecond) // the last report
	var logged int64
	n := 0
	for _, e := range r.eventsSnapshot() {
		if e.Decision.Rule == RuleUDPRate {
			logged += e.Dropped
			n++
		}
	}
	st := r.s.Stats()
	// A burst of one second's worth, then 100/s.
	if max := 100 + int(elapsed.Seconds()*100) + 5; replies > max || replies == 0 {
		t.Errorf("%d packets got through in %v, want 1..%d", replies, elapsed, max)
	}
	if st.UDPDropped == 0 || logged != st.UDPDropped {
		t.Errorf("dropped %d, logged %d in %d events; want all drops logged", st.UDPDropped, logged, n)
	}
	t.Logf("sent 1000 in %v: %d through, %d dropped by the limit, reported in %d events", elapsed, replies, st.UDPDropped, n)
}

func TestMaxFlows(t *testing.T) {
	r := newRig(t, func(c *Config) { c.MaxFlows = 3 })
	r.route("tcp", "198.51.100.10:80", tcpEcho(t))
	var conns []net.Conn
	for i := range 3 {
		c, err := r.dialTCP(ctxT(t), "198.51.100.10:80")
		if err != nil {
			t.Fatalf("flow %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	for range 3 {
		if _, err := r.dialTCP(ctxT(t), "198.51.100.10:80"); !isRefused(err) {
			t.Fatalf("flow over the cap: %v, want refused", err)
		}
	}
	r.waitEvent("max flows", func(e Event) bool { return e.Decision.Rule == RuleMaxFlows })
	conns[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for r.s.Stats().Flows >= 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	c, err := r.dialTCP(ctxT(t), "198.51.100.10:80")
	if err != nil {
		t.Fatalf("after closing one: %v", err)
	}
	c.Close()
	for _, c := range conns[1:] {
		c.Close()
	}
}

func TestReevaluateClosesFlow(t *testing.T) {
	r := newRig(t)
	r.route("tcp", "198.51.100.10:80", tcpEcho(t))
	r.route("tcp", "203.0.113.5:80", httpServer(t))
	if _, err := r.query("allowed.test", dns.TypeA, false); err != nil {
		t.Fatal(err)
	}
	c1, err := r.dialTCP(ctxT(t), "198.51.100.10:80")
	if err != nil {
		t.Fatal(err)
	}
	c2, err := r.dialTCP(ctxT(t), "203.0.113.5:80")
	if err != nil {
		t.Fatal(err)
	}
	rd1, rd2 := bufio.NewReader(c1), bufio.NewReader(c2)
	c1.Write([]byte("hi\n"))
	if l, err := rd1.ReadString('\n'); err != nil || l != "hi\n" {
		t.Fatalf("echo = %q, %v", l, err)
	}
	// A flow allowed by a domain rule names its host (keep-alive HTTP).
	if body, err := keepAliveGet(c2, rd2, "allowed.test"); err != nil || body != "hello allowed.test" {
		t.Fatalf("GET on the domain flow: %q, %v", body, err)
	}
	// The new profile keeps the name but drops the CIDR.
	r.s.SetPolicy(ProfilePolicy(mustProfile(t, "network:\n  allow:\n    - domain: allowed.test\n      ports: [80]\n")))
	if n := r.s.Reevaluate(); n != 1 {
		t.Errorf("Reevaluate closed %d flows, want 1", n)
	}
	c1.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := rd1.ReadString('\n'); err == nil || isTimeout(err) {
		t.Errorf("read on revoked flow: %v, want reset", err)
	}
	if body, err := keepAliveGet(c2, rd2, "allowed.test"); err != nil || body != "hello allowed.test" {
		t.Errorf("flow the new policy allows: %q, %v", body, err)
	}
	e := r.waitEvent("revocation", func(e Event) bool {
		return e.Kind == audit.KindNetRefused && strings.HasPrefix(e.Decision.Reason, "policy changed")
	})
	if e.Flow.Dst.String() != "198.51.100.10:80" {
		t.Errorf("revocation = %+v", e)
	}
	c2.Close()
}

func TestIPv6(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		r := newRig(t)
		r.route("tcp", "[2001:db8::10]:80", httpServer(t))
		// The guest has no IPv6 route here; IPv6 frames the Stack gets are
		// dropped unanswered (no protocol registered).
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if _, err := r.dialTCP(ctx, "[2001:db8::10]:80"); err == nil {
			t.Fatal("IPv6 dial worked with IPv6 off")
		}
		// A guest that does have IPv6 sends a SYN anyway: dropped, but not
		// silently.
		unix.Write(r.gfd, rawFrame6(netipMust("2001:db8::15"), netipMust("2001:db8::10"), uint8(header.TCPProtocolNumber), tcpSYN(80)))
		e := refusedWith(r, RuleIPv6)
		if e.Fields()["dst"] != "[2001:db8::10]:80" || e.Flow.Proto != ProtoTCP || e.Count < 1 {
			t.Errorf("refusal = %+v", e)
		}
		// Its kernel's router solicitations, duplicate address detection
		// and MLD reports (behind a hop-by-hop option) are link
		// housekeeping: not recorded.
		unix.Write(r.gfd, rawFrame6(netipMust("fe80::1"), netipMust("ff02::2"), uint8(header.ICMPv6ProtocolNumber), []byte{133, 0, 0, 0, 0, 0, 0, 0}))
		dad := append([]byte{135, 0, 0, 0, 0, 0, 0, 0}, netipMust("fe80::15").AsSlice()...)
		unix.Write(r.gfd, rawFrame6(netipMust("::"), netipMust("ff02::1:ff00:15"), uint8(header.ICMPv6ProtocolNumber), dad))
		mld := []byte{58, 0, 5, 2, 0, 0, 1, 0, 143, 0, 0, 0, 0, 0, 0, 0}
		unix.Write(r.gfd, rawFrame6(netipMust("fe80::15"), netipMust("ff02::16"), 0, mld))
		// Resolving a neighbour is the guest trying to reach it: recorded.
		ns := append([]byte{135, 0, 0, 0, 0, 0, 0, 0}, netipMust("fe80::1").AsSlice()...)
		unix.Write(r.gfd, rawFrame6(netipMust("fe80::15"), netipMust("ff02::1:ff00:1"), uint8(header.ICMPv6ProtocolNumber), ns))
		e = r.waitEvent("neighbour solicitation", func(e Event) bool { return e.Fields()["dst"] == "fe80::1" })
		if e.Decision.Rule != RuleIPv6 || e.Flow.Proto != "icmpv6" {
			t.Errorf("refusal = %+v", e)
		}
		time.Sleep(2 * summaryInterval)
		for _, e := range r.eventsSnapshot() {
			if d := e.Fields()["dst"]; d != "fe80::1" && d != "[2001:db8::10]:80" {
				t.Errorf("housekeeping recorded: %+v", e)
			}
		}
	})
	t.Run("on", func(t *testing.T) {
		r := newRig(t, func(c *Config) { c.GuestIPv6, c.GatewayIPv6 = guestIP6, gatewayIP6 })
		r.route("tcp", "[2001:db8::10]:80", httpServer(t))
		body, err := r.guestGet(t, "[2001:db8::10]:80", "v6.test")
		if err != nil || body != "hello v6.test" {
			t.Fatalf("GET over IPv6 = %q, %v", body, err)
		}
		m, err := r.query("allowed.test", dns.TypeAAAA, false)
		if err != nil || len(m.Answer) != 1 || m.Answer[0].(*dns.AAAA).AAAA.String() != "2001:db8::5" {
			t.Fatalf("AAAA = %v, %v", m, err)
		}
		if _, err := r.dialTCP(ctxT(t), "[2001:db9::1]:443"); !isRefused(err) {
			t.Fatalf("denied IPv6: %v, want refused", err)
		}
		if got := r.rawExchange(t, "[2001:db9::1]:80", "GET / HTTP/1.1\r\nHost: v6.test\r\n\r\n"); !gatewayRefusal(got) {
			t.Fatalf("denied IPv6, HTTP: %q, want the gateway's 403", got)
		}
	})
}

func TestCloseIdempotentWithLiveFlows(t *testing.T) {
	r := newRig(t)
	r.route("tcp", "198.51.100.10:80", tcpEcho(t))
	var wg sync.WaitGroup
	for range 5 {
		c, err := r.dialTCP(ctxT(t), "198.51.100.10:80")
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); io.Copy(io.Discard, c) }()
	}
	done := make(chan struct{})
	go func() { r.s.Close(); r.s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung")
	}
	if n := r.s.Stats().Flows; n != 0 {
		t.Errorf("%d flows after Close", n)
	}
	n := 0
	for _, e := range r.eventsSnapshot() {
		if e.Kind == audit.KindNetFlow {
			n++
		}
	}
	if n != 5 {
		t.Errorf("%d flow summaries after Close, want 5", n)
	}
}

func TestProfilePolicyDNS(t *testing.T) {
	p := ProfilePolicy(mustProfile(t, `
network:
  allow:
    - domain: "*.a.test"
      ports: ["8000-8100"]
    - cidr: 198.51.100.0/24
  deny:
    - domain: x.a.test
      ports: [8000]
    - domain: y.a.test
      ports: ["7000-9000"]
    - domain: b.test
`))
	for name, want := range map[string]bool{
		"x.a.test": true,  // 8001-8100 remain
		"y.a.test": false, // every allowed port is denied
		"b.test":   false,
		"c.test":   false, // only a cidr rule could open it: dial by address
	} {
		if d := p(Flow{Proto: ProtoDNS, Host: name}); d.Allow != want {
			t.Errorf("%s: %+v, want allow=%v", name, d, want)
		}
	}
	all := ProfilePolicy(mustProfile(t, "network: {mode: allow-all, deny: [{domain: x.test, ports: [22]}]}\n"))
	if d := all(Flow{Proto: ProtoDNS, Host: "x.test"}); !d.Allow {
		t.Errorf("allow-all with a port-limited deny: %+v", d)
	}
	if d := all(Flow{Proto: ProtoDNS, Host: "localhost"}); d.Allow {
		t.Errorf("localhost resolves: %+v", d)
	}
	_ = policy.Decision{}
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, c := range []Config{
		{},
		{GuestIP: guestIP, GatewayIP: netipMust("10.0.3.2")},
		{GuestIP: guestIP, GatewayIP: gatewayIP, GuestIPv6: guestIP6},
		{GuestIP: guestIP, GatewayIP: gatewayIP, HostPorts: map[uint16]uint16{53: 53}},
	} {
		if _, err := New(c, nil); err == nil {
			t.Errorf("New(%+v) succeeded", c)
		}
	}
}
