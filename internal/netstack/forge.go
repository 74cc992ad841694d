package netstack

import (
	"context"
	"net/http"
	"net/url"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// Git forges: a TLS flow whose server name is a forge the profile names
// (a git rule's or a forge credential's host) is terminated with the
// sandbox CA, as for credential brokering, and its HTTP/1.1 requests are
// handed to the Git gateway (Config.Forge, internal/gitgw), which enforces
// the profile's git section and attaches the forge credential upstream.
// This happens whatever network rule allowed the flow (domain, cidr,
// allow-all), so a forge's git rules cannot be skipped by reaching it some
// other way; a raw-IP TLS flow on port 443 is inspected too when the
// profile names any forge, so its server name decides.

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
// server name can be handed to the forge gateway.
func (s *Stack) forgeInspect(f Flow) bool {
	fg := s.cfg.Forge
	if fg == nil || f.Proto != ProtoTCP {
		return false
	}
	if f.Host == "" {
		return f.Dst.Port() == 443 && fg.HasForges()
	}
	return f.Host != HostInternal && fg.IsForge(f.Host)
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
