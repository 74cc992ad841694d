package netstack

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// The ask tests put flows on hold through a real approval.Holder (the one
// the supervisor keeps), answered by the test as the host user would be
// through the service.

const askNetProfile = `
network:
  mode: default-deny
  ask:
    - domain: newhost.ask.test
      ports: [80]
    - domain: quic.ask.test
      proto: udp
      ports: [443]
`

const askNetHosts = `
203.0.113.40 newhost.ask.test
203.0.113.41 quic.ask.test
203.0.113.42 nobody.ask.test
`

type askRig struct {
	*rig
	*hostAsks
}

func newAskRig(t *testing.T) *askRig {
	t.Helper()
	a := &askRig{hostAsks: newHostAsks()}
	hosts, err := ParseHosts(strings.NewReader(askNetHosts), "hosts")
	if err != nil {
		t.Fatal(err)
	}
	prof := mustProfile(t, askNetProfile)
	a.rig = newRig(t, func(c *Config) {
		c.Policy = ProfilePolicy(prof)
		c.Resolver = hosts
		c.Ask = func(ctx context.Context, f Flow, d policy.Decision, what string) policy.Decision {
			ans := a.holder.Ask(ctx, approval.Question{Channel: "network", What: what, Rule: d.Rule})
			if !ans.Allow {
				return policy.Decision{Rule: d.Rule, Reason: what + " was asked of the host user: " + ans.Reason}
			}
			return policy.Decision{Allow: true, Rule: RuleApproved + ans.ID + " (" + ans.Decision + ")", Reason: "allowed " + what}
		}
	})
	return a
}

// asked is how many questions were put to the host user.
func (a *askRig) asked() int { return a.count(approval.KindRequested) }

func (a *askRig) dialedUDP(dst string) bool {
	a.rig.mu.Lock()
	defer a.rig.mu.Unlock()
	for _, d := range a.rig.dialed {
		if d == "udp "+dst {
			return true
		}
	}
	return false
}

// A name only an ask rule names, and only on some ports, is resolved (the
// old gateway answered NXDOMAIN: the rule could never be asked), and the
// flow to it is held once, the question naming the HTTP request.
func TestAskDNSName(t *testing.T) {
	a := newAskRig(t)
	a.route("tcp", "203.0.113.40:80", httpServer(t))
	for _, q := range []uint16{dns.TypeA, dns.TypeAAAA} {
		m, err := a.query("newhost.ask.test", q, false)
		if err != nil || m.Rcode != dns.RcodeSuccess {
			t.Fatalf("newhost.ask.test (type %d) under an ask rule: %v %v", q, m, err)
		}
	}
	if m, err := a.query("nobody.ask.test", dns.TypeA, false); err != nil || m.Rcode != dns.RcodeNameError {
		t.Fatalf("a name no rule names resolved: %v %v", m, err)
	}
	if a.asked() != 0 {
		t.Fatal("a name lookup was asked about: the question belongs to the flow")
	}
	done := make(chan string, 1)
	go func() {
		out, err := a.guestGet(t, "203.0.113.40:80", "newhost.ask.test")
		if err != nil {
			out = "error: " + err.Error()
		}
		done <- out
	}()
	q := a.question(t)
	if q.What != "GET http://newhost.ask.test/" || !strings.Contains(q.Rule, "network.ask[0]") {
		t.Fatalf("question %+v", q)
	}
	if _, err := a.holder.Answer(q.ID, approval.Once, "test", nil); err != nil {
		t.Fatal(err)
	}
	select {
	case out := <-done:
		if !strings.Contains(out, "hello newhost.ask.test") {
			t.Fatalf("after allow once the guest got %q", out)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held flow did not finish after the answer")
	}
	if n := a.asked(); n != 1 {
		t.Fatalf("%d questions for one request, want 1", n)
	}
}

// A UDP session an ask rule covers is held: its datagrams wait, nothing is
// dialled, and once allowed they reach the destination in order; a session
// denied is refused, and its retries are not asked about again; what waits
// is bounded by the session's receive buffer.
func TestAskUDP(t *testing.T) {
	a := newAskRig(t)
	a.route("udp", "203.0.113.41:443", udpEcho(t))
	a.resolve(t, "quic.ask.test")

	c := a.dialUDP("203.0.113.41:443")
	defer c.Close()
	c.Write([]byte("one"))
	c.Write([]byte("two"))
	q := a.question(t)
	if q.Channel != "network" || q.What != "udp quic.ask.test:443 (203.0.113.41)" || !strings.Contains(q.Rule, "network.ask[1]") {
		t.Fatalf("question %+v", q)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 2048)
	if n, err := c.Read(buf); err == nil {
		t.Fatalf("a held session was answered before the host user: %q", buf[:n])
	}
	if a.dialedUDP("203.0.113.41:443") {
		t.Fatal("a held session was dialled before the answer")
	}
	if _, err := a.holder.Answer(q.ID, approval.Once, "test", nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"one", "two"} {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := c.Read(buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("after allow once: %q %v, want %q", buf[:n], err, want)
		}
	}

	// Another session (another source port): asked again; denied.
	d := a.dialUDP("203.0.113.41:443")
	defer d.Close()
	d.Write([]byte("three"))
	q = a.question(t)
	if _, err := a.holder.Answer(q.ID, approval.Deny, "test", nil); err != nil {
		t.Fatal(err)
	}
	e := a.waitEvent("the denied session's refusal", func(e Event) bool {
		return e.Kind == audit.KindNetRefused && e.Flow.Proto == ProtoUDP && strings.Contains(e.Decision.Reason, "denied")
	})
	if e.Flow.Host != "quic.ask.test" || !strings.Contains(e.Decision.Rule, "network.ask[1]") {
		t.Errorf("refusal %+v", e)
	}
	for range 3 {
		d.Write([]byte("again"))
	}
	d.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := d.Read(buf); err == nil {
		t.Fatalf("a denied session got %q", buf[:n])
	}
	if n := a.asked(); n != 2 {
		t.Fatalf("%d questions, want 2: a denied session's retries are not asked about again", n)
	}

	// Bounded: 200 datagrams of 1 KiB sent while held; fewer wait.
	b := a.dialUDP("203.0.113.41:443")
	defer b.Close()
	payload := []byte(strings.Repeat("x", 1000))
	for i := range 200 {
		copy(payload, fmt.Sprintf("%03d", i))
		b.Write(payload)
	}
	q = a.question(t)
	time.Sleep(time.Second) // every datagram has reached the gateway
	if _, err := a.holder.Answer(q.ID, approval.Once, "test", nil); err != nil {
		t.Fatal(err)
	}
	got := 0
	for {
		b.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := b.Read(buf); err != nil {
			break
		}
		if got == 0 && string(buf[:3]) != "000" {
			t.Errorf("the first datagram relayed is %q, want the first sent", buf[:3])
		}
		got++
	}
	t.Logf("%d of 200 datagrams sent while held were relayed", got)
	if got == 0 || got > 17 {
		t.Fatalf("%d of 200 datagrams sent while held were relayed; want the first ones, at most what 16 KiB holds", got)
	}
}
