package netstack

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/netstack/sniff"
	"github.com/smx-dev/smx/internal/policy"
)

// Git forges: a TLS flow whose server name is a forge the profile names
// (a git rule's or a forge credential's host) is terminated with the
// sandbox CA, as for credential brokering, and its HTTP/1.1 requests are
// handed to the Git gateway (Config.Forge, internal/gitgw), which enforces
// the profile's git section and attaches the forge credential upstream.
//
// This happens whatever network rule allowed the flow (domain, cidr,
// allow-all) and whatever name the flow was allowed under: while the
// profile names any forge, every TCP flow to port 443 is inspected and its
// server name decides (a flow allowed for another name that resolves to
// the forge's address, or a raw address, is still the forge's when its
// server name says so), so a forge's git rules cannot be skipped by
// reaching it some other way. The name is compared as DNS compares it
// (case and one trailing dot do not matter). A ClientHello to port 443
// without a server name is refused then: it could reach a forge's default
// certificate with nothing to decide it by. Plain HTTP to port 80 is read
// request by request (httpgw.go) and a request whose Host names a forge is
// refused: the Git gateway takes forges over HTTPS only, so plain HTTP to
// one would carry Git past its rules. A profile change that names a forge
// closes live connections that opened past the Git gateway and would now
// go through it (forgeRecheck). Not covered: the inner server name
// of an Encrypted Client Hello (the gateway's DNS answers A and AAAA only,
// so it hands out no ECH configuration, but a guest may bring its own and
// reach a forge served behind an ECH front end under the front end's
// public name), TLS or plain HTTP to a forge on a port other than 443 and
// 80 reached by address or another name under a cidr rule or allow-all (a
// flow to the forge's own name is inspected on every port), and TLS inside a CONNECT tunnel through a proxy the profile
// allows by cidr or allow-all (a CONNECT to a forge read by the gateway is
// refused).

// Refusals that keep forges behind the Git gateway.
const (
	// RuleForgeHTTP refuses plain HTTP to a forge and a CONNECT to one:
	// the Git gateway takes forges over HTTPS only.
	RuleForgeHTTP = "netstack: forge over plain HTTP"
	// RuleForgeLater closes, on a profile change, a live connection that
	// the new profile's forges would have sent through the Git gateway.
	RuleForgeLater = "netstack: forge named later"
)

// ForgeGateway serves the guest's HTTPS requests to Git forges. It must
// be safe for concurrent use.
type ForgeGateway interface {
	// IsForge reports whether host (a lower-case name) is a forge whose
	// HTTPS the gateway must take.
	IsForge(host string) bool
	// HasForges reports whether any forge is named at all.
	HasForges() bool
	// Handler serves one guest connection to forge host. base is
	// https://host[:port]; rt sends requests over TLS verified for host
	// to the address the guest dialled.
	Handler(host string, base *url.URL, rt http.RoundTripper) http.Handler
}

// forgeInspect reports whether flow f must be inspected so that its
// server name (or, on port 80, its Host) can be checked for a forge.
func (s *Stack) forgeInspect(f Flow) bool {
	fg := s.cfg.Forge
	if fg == nil || f.Proto != ProtoTCP || f.Host == HostInternal || !fg.HasForges() {
		return false
	}
	if p := f.Dst.Port(); p == 443 || p == 80 {
		return true
	}
	return f.Host != "" && fg.IsForge(f.Host)
}

// forgeHTTP reports whether plain HTTP on flow f is read request by
// request for a Host naming a forge.
func (s *Stack) forgeHTTP(f Flow) bool {
	return s.forgeInspect(f) && (f.Dst.Port() == 80 || s.cfg.Forge.IsForge(f.Host))
}

// isForge reports whether name (as sent: any case, one trailing dot) is a
// forge the profile names.
func (s *Stack) isForge(name string) bool {
	fg := s.cfg.Forge
	return fg != nil && fg.IsForge(strings.TrimSuffix(strings.ToLower(name), "."))
}

// forgeRefusal refuses what an inspected flow f (allowed by d) carries
// that would reach a forge past the Git gateway: TLS to port 443 without a
// server name while forges are named, or a server name naming a forge
// that the network rules refuse (it is not dialled directly instead).
func (s *Stack) forgeRefusal(f Flow, d policy.Decision, sn sniff.Result) *policy.Decision {
	if sn.Kind != sniff.TLS || !s.forgeInspect(f) {
		return nil
	}
	via := " (the flow to " + f.Dst.String() + " was allowed by " + d.Rule + ")"
	if !sn.Hello.HasSNI {
		if f.Dst.Port() != 443 {
			return nil
		}
		return &policy.Decision{Rule: RuleNoName, Reason: "TLS ClientHello without a server name to port 443: the profile names Git forges, " +
			"and the server name decides whether the Git gateway takes a connection, so TLS to port 443 must name its server; connect by name" + via}
	}
	if !s.isForge(sn.Hello.SNI) {
		return nil
	}
	nf := f
	nf.Host = strings.TrimSuffix(sn.Hello.SNI, ".")
	if nd := s.decide(nf); !nd.Allow {
		nd.Reason = claimSNI + " " + strconv.Quote(sn.Hello.SNI) + ": " + nd.Reason + via
		return &nd
	}
	return nil
}

// serveForge terminates the guest's TLS to forge nf.Host and serves its
// requests with the forge gateway. It reports false, having done nothing,
// when nf is not a forge flow.
func (s *Stack) serveForge(ctx context.Context, g *gonet.TCPConn, prefix []byte, lf *liveFlow, nf Flow, d policy.Decision, conns *tcpConns) bool {
	fg := s.cfg.Forge
	if fg == nil || !fg.IsForge(nf.Host) {
		return false
	}
	sni := nf.Host
	flowEvent := Event{Kind: audit.KindNetFlow, Flow: nf, Decision: d, SNI: sni}
	if s.cfg.CA == nil {
		g.Close()
		conns.abort()
		s.emit(Event{Kind: audit.KindNetRefused, Flow: nf, SNI: sni, Decision: policy.Decision{Rule: RuleNoBrokerCA,
			Reason: sni + " is a Git forge the profile names but the gateway has no CA to terminate TLS with"}})
		return true
	}
	lf.mu.Lock()
	lf.forge = true
	lf.mu.Unlock()
	tc, cc, ok := s.terminateTLS(ctx, g, prefix, sni, lf, flowEvent)
	if !ok {
		return true
	}
	base := upstreamURL(sni, nf.Dst.Port())
	tr := s.upstreamTransport(sni, nf.Dst, conns)
	defer tr.CloseIdleConnections()
	s.serveHTTP(tc, fg.Handler(sni, base, tr), cc, len(prefix), lf, flowEvent)
	return true
}

// forgeRecheck refuses, on a profile change, a live flow (allowed by d,
// with claims cs) that does not go through the Git gateway but would if it
// opened now: one to port 443 whose server name was never read, or one
// whose server name is now a forge. An SSH-routed flow is the SSH
// gateway's.
func (s *Stack) forgeRecheck(lf *liveFlow, d policy.Decision, cs []claim, inspected bool) (*policy.Decision, claim) {
	f := lf.flow
	lf.mu.Lock()
	served := lf.forge
	lf.mu.Unlock()
	if served || isSSHRoute(d) || !s.forgeInspect(f) {
		return nil, claim{}
	}
	if !inspected {
		what := "the server name of this connection to port 443 was not read"
		if f.Dst.Port() == 80 {
			what = "the requests on this connection to port 80 were not read"
		} else if f.Dst.Port() != 443 {
			what = "this connection to " + strconv.Quote(f.Host) + " was not read"
		}
		return &policy.Decision{Rule: RuleForgeLater, Reason: "the profile now names Git forges, and " + what +
			" when it opened; reconnect, so that the Git gateway takes it if it is a forge's"}, claim{}
	}
	for _, c := range cs {
		if c.what == claimSNI && s.isForge(c.name) {
			return &policy.Decision{Rule: RuleForgeLater, Reason: "the profile now names " + strconv.Quote(c.name) +
				" as a Git forge, and this connection to it opened before, past the Git gateway; reconnect, so that the Git gateway takes it"}, c
		}
	}
	return nil, claim{}
}
