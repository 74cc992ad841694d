package netstack

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"smx/internal/audit"
	"smx/internal/netstack/sniff"
	"smx/internal/policy"
)

// Why a domain rule is checked against the stream.
//
// Our DNS server remembers which name each answered address was for, and a
// flow to that address is judged by the name's domain rules. But many names
// share an address (CDNs, cloud front ends), so an allowed name's address
// would otherwise carry a TLS ClientHello or an HTTP request for any other
// name served there (domain fronting at the SNI/Host level, or an HTTP
// CONNECT through an allowed proxy). So a flow allowed because of a domain
// rule is accepted from the guest first, its first bytes are read (within
// Config.PeekTimeout) and the name they carry is decided again:
//
//   - TLS: the ClientHello's server name must be allowed for this address
//     and port; a hello without one is refused; a malformed hello is
//     refused.
//   - HTTP/1.x: every name the first request gives (an absolute-form
//     target's authority and the Host header) must be allowed; a request
//     with none is refused. A Host that is the dialled address itself
//     (curl http://IP/ after resolving the name) names nothing new and
//     passes. A CONNECT's target must be allowed on its port.
//   - Anything else (SSH, a database protocol) names nothing and passes.
//
// Only then is the destination dialled, so a refused name never reaches
// it; the cost is that an unreachable upstream is an accepted connection
// that is then reset rather than a refused SYN. A flow allowed by a cidr
// rule, host_ports or allow-all is not inspected (it is allowed whatever
// name it carries) unless a credential is bound to its name. Not checked:
// requests after the first on a plain-HTTP keep-alive connection, and names
// inside TLS (a front end that routes on the inner Host can still be
// fronted; only brokered destinations are terminated).

// Refusals made while inspecting a flow.
const (
	RuleNoName     = "netstack: no name"            // TLS without SNI, HTTP without Host, under a domain rule
	RuleMalformed  = "netstack: malformed"          // a ClientHello or request head that does not parse
	RuleSilent     = "netstack: nothing sent"       // the guest sent nothing within PeekTimeout
	RuleHostSNI    = "netstack: host mismatch"      // a brokered request's Host differs from its SNI
	RuleNoSecret   = "netstack: credential missing" // the bound secret is not in the host store
	RuleNoBrokerCA = "netstack: no broker CA"       // a credential is bound but Config.CA is nil
)

// isDomainRule reports whether d was made by a network allow rule that
// names a domain (rule labels read "FILE:L:C network.allow[i] domain ...").
func isDomainRule(d policy.Decision) bool {
	i := strings.Index(d.Rule, " network.allow[")
	return d.Allow && i >= 0 && strings.Contains(d.Rule[i:], "] domain ")
}

// inspectTCP handles a flow whose first bytes must be read before it is
// dialled: one allowed by a domain rule (checkNames), or one whose name has
// a credential bound (brokering).
func (s *Stack) inspectTCP(ctx context.Context, r *tcp.ForwarderRequest, lf *liveFlow, d policy.Decision, checkNames bool, conns *tcpConns) {
	f := lf.flow
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, Duration: time.Since(lf.start), Err: "guest handshake: " + terr.String()})
		return
	}
	r.Complete(false)
	ep.SocketOptions().SetKeepAlive(true)
	g := gonet.NewTCPConn(&wq, ep)
	if !conns.setGuest(ep) {
		return
	}
	g.SetReadDeadline(time.Now().Add(s.cfg.PeekTimeout))
	sn, err := sniff.Read(g)
	g.SetReadDeadline(time.Time{})
	if err != nil {
		var rule, reason string
		switch {
		case errors.Is(err, sniff.ErrMalformed):
			rule, reason = RuleMalformed, err.Error()
		case errors.Is(err, os.ErrDeadlineExceeded) || isTimeout(err):
			rule, reason = RuleSilent, "the guest sent nothing within "+s.cfg.PeekTimeout.String()+
				"; a flow allowed by a domain rule must name its destination first (TLS server name or HTTP Host)"
		default:
			// The guest closed or reset before naming anything.
			ep.Abort()
			s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, BytesOut: int64(len(sn.Prefix)),
				Duration: time.Since(lf.start), Err: "before the first request: " + err.Error()})
			return
		}
		ep.Abort()
		s.refuse(f, policy.Decision{Rule: rule, Reason: reason + " (flow allowed by " + d.Rule + ")"})
		return
	}
	e := Event{Kind: audit.KindNetFlow, Flow: f, Decision: d}
	switch sn.Kind {
	case sniff.TLS:
		e.SNI = sn.Hello.SNI
	case sniff.HTTP:
		if len(sn.Hosts) > 0 {
			e.HTTPHost = sn.Hosts[len(sn.Hosts)-1]
		}
		e.Connect = sn.Connect
	}
	if refusal := s.checkNames(f, d, sn, checkNames); refusal != nil {
		ep.Abort()
		e.Kind, e.Decision = audit.KindNetRefused, *refusal
		s.emit(e)
		return
	}
	if sn.Kind == sniff.TLS && sn.Hello.HasSNI {
		nf := f
		nf.Host = strings.ToLower(strings.TrimSuffix(sn.Hello.SNI, "."))
		if nd := s.decide(nf); nd.Allow && s.serveForge(ctx, g, sn.Prefix, lf, nf, nd, conns) {
			return
		}
		if cred, ok := s.credential(nf); ok {
			if nd := s.decide(nf); nd.Allow {
				s.broker(ctx, g, sn.Prefix, lf, nf, nd, cred, conns)
				return
			}
		}
	}

	dctx, dcancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	up, err := s.cfg.Dial(dctx, "tcp", f.Dst.String())
	dcancel()
	if err != nil {
		ep.Abort()
		e.Duration, e.Err = time.Since(lf.start), "dial: "+err.Error()
		s.emit(e)
		return
	}
	if !conns.addUp(up) {
		return
	}
	if _, err := up.Write(sn.Prefix); err != nil {
		ep.Abort()
		up.Close()
		e.Duration, e.Err = time.Since(lf.start), "upstream: "+err.Error()
		s.emit(e)
		return
	}
	out, in, err := splice(g, up)
	e.BytesOut, e.BytesIn, e.Duration = out+int64(len(sn.Prefix)), in, time.Since(lf.start)
	if err != nil {
		e.Err = err.Error()
	}
	s.emit(e)
}

// checkNames decides the names sn carries for flow f (allowed by d). It
// returns nil when they pass, else the refusal to log. With strict false
// (no domain rule is involved) only the names present are checked.
func (s *Stack) checkNames(f Flow, d policy.Decision, sn sniff.Result, strict bool) *policy.Decision {
	if !strict {
		return nil
	}
	via := " (the flow to " + f.Dst.String() + " was allowed for " + f.Host + " by " + d.Rule + ")"
	check := func(what, name string, port uint16, dst netip.Addr) *policy.Decision {
		g := f
		g.Host = strings.TrimSuffix(name, ".")
		g.Dst = netip.AddrPortFrom(dst, port)
		nd := s.decide(g)
		if nd.Allow {
			return nil
		}
		nd.Reason = what + " " + strconv.Quote(name) + ": " + nd.Reason + via
		return &nd
	}
	switch sn.Kind {
	case sniff.TLS:
		if !sn.Hello.HasSNI {
			return &policy.Decision{Rule: RuleNoName, Reason: "TLS ClientHello without a server name" + via}
		}
		return check("TLS server name", sn.Hello.SNI, f.Dst.Port(), f.Dst.Addr())
	case sniff.HTTP:
		if sn.Connect != "" {
			host, ps, _ := net.SplitHostPort(sn.Connect)
			port, err := strconv.ParseUint(ps, 10, 16)
			if err != nil || port == 0 {
				return &policy.Decision{Rule: RuleMalformed, Reason: "HTTP CONNECT target " + strconv.Quote(sn.Connect) + ": bad port" + via}
			}
			// The target is dialled by the proxy, not by us: decide it by
			// name (or, for an IP literal, by address) alone.
			return check("HTTP CONNECT target", strings.ToLower(host), uint16(port), netip.Addr{})
		}
		if len(sn.Hosts) == 0 {
			return &policy.Decision{Rule: RuleNoName, Reason: "HTTP request without a Host" + via}
		}
		for _, h := range sn.Hosts {
			name := sniff.HostOnly(h)
			if ip, err := netip.ParseAddr(name); err == nil && ip.Unmap() == f.Dst.Addr().Unmap() {
				continue // the address the flow was allowed for: names nothing new
			}
			if rd := check("HTTP Host", name, f.Dst.Port(), f.Dst.Addr()); rd != nil {
				return rd
			}
		}
	}
	return nil
}

// credential returns the credential bound to f's name, if any.
func (s *Stack) credential(f Flow) (policy.Credential, bool) {
	if f.Host == "" || f.Host == HostInternal {
		return policy.Credential{}, false
	}
	c := s.creds.Load()
	if c == nil || *c == nil {
		return policy.Credential{}, false
	}
	return (*c)(f)
}
