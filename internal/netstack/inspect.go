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

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/netstack/sniff"
	"github.com/smx-dev/smx/internal/policy"
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
//   - HTTP/1.x (after any empty lines, which servers skip): every name the
//     first request gives (an absolute-form target's authority and the
//     Host header) must be allowed; a request with none is refused. A Host
//     that is the dialled address itself (curl http://IP/ after resolving
//     the name) names nothing new and passes. A CONNECT's target must be
//     allowed on its port. Every later request on the connection is read
//     by the gateway's own HTTP server and decided the same way before it
//     is forwarded (httpgw.go).
//   - Anything else is refused: a flow allowed only by a domain rule must
//     name its destination. Other protocols need a cidr rule.
//
// Only then is the destination dialled, so a refused name never reaches
// it; the cost is that an unreachable upstream is an accepted connection
// that is then reset rather than a refused SYN. A flow allowed by a cidr
// rule, host_ports or allow-all is not inspected (it is allowed whatever
// name it carries) unless a credential is bound to its name. The names a
// flow carried are kept with it, so a policy change decides them again
// (Reevaluate). Not checked: names inside TLS that is not brokered (a front
// end that routes on the inner Host can still be fronted; only brokered
// destinations are terminated), and what a CONNECT tunnel or an upgraded
// connection (101 Switching Protocols) carries after the check.

// Refusals made while inspecting a flow.
const (
	RuleNoName    = "netstack: no name"            // TLS without SNI, HTTP without Host, under a domain rule
	RuleMalformed = "netstack: malformed"          // a ClientHello or request head that does not parse
	RuleSilent    = "netstack: nothing sent"       // the guest sent nothing within PeekTimeout
	RuleUnnamed   = "netstack: names nothing"      // neither TLS nor HTTP on a flow a domain rule allowed
	RuleHostSNI   = "netstack: host mismatch"      // a brokered request's Host differs from its SNI
	RuleNoSecret  = "netstack: credential missing" // the bound secret is not in the host store
	// RuleUntrustedCA: a guest client gave up on a terminated TLS
	// connection during or right after the handshake, the mark of a client
	// that does not trust the sandbox CA (see untrustedCA).
	RuleUntrustedCA = "netstack: sandbox CA not trusted"
	RuleNoBrokerCA  = "netstack: no broker CA"   // a credential is bound but Config.CA is nil
	RuleCredAsk     = "netstack: credential ask" // a binding that says ask was not approved
)

// isDomainRule reports whether d was made by a network allow rule that
// names a domain (rule labels read "FILE:L:C network.allow[i] domain ...").
func isDomainRule(d policy.Decision) bool {
	if d.Allow && strings.HasPrefix(d.Rule, RuleApproved) {
		// A grant by name reads "approved ID (scope) domain NAME ...".
		return strings.Contains(d.Rule, ") domain ")
	}
	i := strings.Index(d.Rule, " network.allow[")
	return d.Allow && i >= 0 && strings.Contains(d.Rule[i:], "] domain ")
}

// A claim is one name a flow's bytes gave for its destination. Claims are
// decided when they are seen and kept with the flow, so that Reevaluate
// decides them again under a new policy.
type claim struct {
	what string // "TLS server name", "HTTP Host", "HTTP CONNECT target"
	name string // as sent (lower case, trailing dot kept)
	port uint16
	addr netip.Addr // the dialled address; zero for a CONNECT target (the proxy dials it)
}

func (c claim) flow(f Flow) Flow {
	g := f
	g.Host = strings.TrimSuffix(c.name, ".")
	g.Dst = netip.AddrPortFrom(c.addr, c.port)
	return g
}

// addClaims records claims on a live flow (once each).
func (f *liveFlow) addClaims(cs ...claim) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inspected = true
next:
	for _, c := range cs {
		for _, o := range f.claims {
			if o == c {
				continue next
			}
		}
		if len(f.claims) < maxClaims {
			f.claims = append(f.claims, c)
		}
	}
}

// maxClaims bounds the names kept per flow; a keep-alive connection naming
// more distinct hosts than this is refused (see httpgw.go).
const maxClaims = 64

func (f *liveFlow) claimsSnapshot() ([]claim, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]claim(nil), f.claims...), f.inspected
}

// inspectTCP handles a flow whose first bytes must be read before it is
// dialled: one allowed by a domain rule (strict), or one whose name has a
// credential bound (brokering).
func (s *Stack) inspectTCP(ctx context.Context, r *tcp.ForwarderRequest, lf *liveFlow, d policy.Decision, strict bool, conns *tcpConns) {
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
	claims, refusal := s.claimsOf(f, d, sn, strict)
	if refusal == nil && strict {
		var bad claim
		if refusal, bad = s.decideClaims(f, d, claims); refusal != nil {
			claims = []claim{bad} // the name the refusal was decided on
		}
		if refusal != nil && refusal.Ask && s.cfg.Ask != nil {
			// The flow was allowed for one name and its bytes name
			// another that a rule says ask about: hold it, as hold.go
			// does a flow asked about from the start.
			nf, what, _ := heldName(f, sn)
			nf = bad.flow(f)
			lf.mu.Lock()
			lf.held = true
			lf.mu.Unlock()
			ad := s.cfg.Ask(ctx, nf, *refusal, what)
			lf.mu.Lock()
			lf.held = false
			if ad.Allow {
				lf.asked = append(lf.asked, bad)
			}
			lf.mu.Unlock()
			if ad.Allow {
				refusal = nil
			} else {
				refusal = &ad
			}
		}
	}
	for _, c := range claims {
		switch c.what {
		case claimSNI:
			e.SNI = c.name
		case claimHost:
			if e.HTTPHost == "" {
				e.HTTPHost = c.name
			}
		case claimConnect:
			e.Connect = net.JoinHostPort(c.name, strconv.Itoa(int(c.port)))
		}
	}
	if refusal != nil {
		e.Kind, e.Decision = audit.KindNetRefused, *refusal
		s.emit(e)
		if sn.Kind == sniff.HTTP {
			// Plain HTTP: say why, as for a refused later request.
			host := e.HTTPHost
			if host == "" {
				host = f.Dst.String()
			}
			what := "request for " + strconv.Quote(host)
			if e.Connect != "" {
				what = "CONNECT to " + strconv.Quote(e.Connect)
			}
			answerRefusal(g, what, *refusal)
			return
		}
		ep.Abort()
		return
	}
	if fr := s.forgeRefusal(f, d, sn); fr != nil {
		e.Kind, e.Decision = audit.KindNetRefused, *fr
		s.emit(e)
		ep.Abort()
		return
	}
	lf.addClaims(claims...)
	if sn.Kind == sniff.TLS && sn.Hello.HasSNI {
		nf := f
		nf.Host = strings.TrimSuffix(sn.Hello.SNI, ".")
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
	if sn.Kind == sniff.HTTP && (strict || s.forgeHTTP(f)) {
		s.proxyHTTP(ctx, g, sn, lf, d, strict, conns, e)
		return
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

// What a claim is.
const (
	claimSNI     = "TLS server name"
	claimHost    = "HTTP Host"
	claimConnect = "HTTP CONNECT target"
)

// claimsOf lists the names sn gives for flow f. With strict (the flow was
// allowed by a domain rule) a stream that names nothing is refused.
func (s *Stack) claimsOf(f Flow, d policy.Decision, sn sniff.Result, strict bool) ([]claim, *policy.Decision) {
	via := " (the flow to " + f.Dst.String() + " was allowed for " + f.Host + " by " + d.Rule + ")"
	var cs []claim
	switch sn.Kind {
	case sniff.TLS:
		if sn.Hello.HasSNI {
			cs = append(cs, claim{claimSNI, sn.Hello.SNI, f.Dst.Port(), f.Dst.Addr()})
		} else if strict {
			return nil, &policy.Decision{Rule: RuleNoName, Reason: "TLS ClientHello without a server name" + via}
		}
	case sniff.HTTP:
		if sn.Connect != "" {
			host, port, _, why := connectTarget(sn.Connect)
			if why != "" {
				return nil, &policy.Decision{Rule: RuleMalformed, Reason: why + via}
			}
			// The target is dialled by the proxy, not by us: decide it by
			// name (or, for an IP literal, by address) alone.
			return []claim{{claimConnect, host, port, netip.Addr{}}}, nil
		}
		for _, h := range sn.Hosts {
			if c, ok := hostClaim(f, h); ok {
				cs = append(cs, c)
			}
		}
		if len(sn.Hosts) == 0 && strict {
			return nil, &policy.Decision{Rule: RuleNoName, Reason: "HTTP request without a Host" + via}
		}
	default:
		if strict {
			return nil, &policy.Decision{Rule: RuleUnnamed, Reason: "the flow's first bytes are neither a TLS ClientHello nor an HTTP/1.x request, " +
				"so they name no destination to check against the domain rule; use a cidr rule for other protocols" + via}
		}
	}
	return cs, nil
}

// hostClaim is the claim an HTTP authority makes on flow f; none when it
// is the dialled address itself (it names nothing new).
func hostClaim(f Flow, authority string) (claim, bool) {
	name := sniff.HostOnly(authority)
	if ip, err := netip.ParseAddr(name); err == nil && ip.Unmap() == f.Dst.Addr().Unmap() {
		return claim{}, false
	}
	return claim{claimHost, name, f.Dst.Port(), f.Dst.Addr()}, true
}

// decideClaims decides each claim for flow f (allowed by d). It returns nil
// when all pass, else the refusal and the claim refused.
func (s *Stack) decideClaims(f Flow, d policy.Decision, cs []claim) (*policy.Decision, claim) {
	via := " (the flow to " + f.Dst.String() + " was allowed for " + f.Host + " by " + d.Rule + ")"
	for _, c := range cs {
		nd := s.decide(c.flow(f))
		if !nd.Allow {
			nd.Reason = c.what + " " + strconv.Quote(c.name) + ": " + nd.Reason + via
			return &nd, c
		}
	}
	return nil, claim{}
}

// recheck decides a live flow again under the current policy with
// everything its first decision used: the flow itself, the host-address
// check, and every name its bytes carried. A flow that only a domain rule
// now allows but whose names were never read (it opened under a cidr rule
// or allow-all) is refused: the gateway cannot read them now.
func (s *Stack) recheck(lf *liveFlow) (*policy.Decision, claim) {
	f := lf.flow
	d := s.decide(f)
	if d.Allow {
		d = s.hostAddrCheck(f, d)
	}
	lf.mu.Lock()
	approved, held := lf.approved, lf.held
	lf.mu.Unlock()
	if held {
		return nil, claim{} // its answer decides it
	}
	if d.Ask && approved {
		return nil, claim{} // still asked about, and this flow was answered
	}
	if !d.Allow {
		return &d, claim{}
	}
	cs, inspected := lf.claimsSnapshot()
	if r, c := s.forgeRecheck(lf, d, cs, inspected); r != nil {
		return r, c
	}
	if len(cs) > 0 {
		if cs = lf.unasked(cs); len(cs) == 0 {
			return nil, claim{} // every name on it was allowed by the host user
		}
		return s.decideClaims(f, d, cs)
	}
	if isDomainRule(d) && f.Proto == ProtoTCP {
		what := "its first bytes were not read when it opened"
		if inspected {
			what = "it named no destination when it opened"
		}
		return &policy.Decision{Rule: RuleNoName, Reason: "the flow is now allowed only by a domain rule (" + d.Rule +
			"), but " + what}, claim{}
	}
	return nil, claim{}
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
