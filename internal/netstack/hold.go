package netstack

import (
	"context"
	"net"
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

// AskFunc puts a flow the policy says ask about to the host user and
// blocks until the answer (Config.Ask). f is the flow with the name its
// first bytes gave (TLS server name or HTTP Host), d the decision that
// said ask, what the exact thing asked. It returns an allowing decision
// (its Rule names the approval) or a refusal.
type AskFunc func(ctx context.Context, f Flow, d policy.Decision, what string) policy.Decision

// RuleApproved starts the rule of a decision that an approval made (a
// grant for the sandbox's life, or one flow allowed once).
const RuleApproved = "approved "

// holdTCP serves a TCP flow the policy says ask about. The guest's
// handshake is completed and its first bytes read, as for a flow allowed
// by a domain rule (inspect.go), so that the question names the TLS server
// name or HTTP Host rather than an address; then the flow waits, in this
// goroutine and with nothing sent upstream, for Config.Ask. To the guest
// it is a slow server. A refusal is answered as any other (HTTP: a
// readable 403; TLS: a reset).
//
// A flow allowed once is spliced to the address it dialled; a later
// profile change keeps it (it was approved as it is). Brokering and the
// Git gateway apply to flows the policy allows outright, which an answer
// of sandbox or always makes every later one.
func (s *Stack) holdTCP(ctx context.Context, r *tcp.ForwarderRequest, lf *liveFlow, d policy.Decision, conns *tcpConns) {
	f := lf.flow
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
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
		ep.Abort()
		s.refuse(f, policy.Decision{Rule: RuleSilent, Reason: "the flow waits for the host user's answer only once its first bytes name it: " +
			err.Error() + " (asked by " + d.Rule + ")"})
		return
	}
	nf, what, c := heldName(f, sn)
	e := Event{Kind: audit.KindNetFlow, Flow: nf}
	switch c.what {
	case claimSNI:
		e.SNI = c.name
	case claimHost:
		e.HTTPHost = c.name
	case claimConnect:
		e.Connect = c.name
	}
	nd := d
	if nf.Host != f.Host {
		// The bytes name another host than the address was looked up
		// for: that name decides (a deny on it stays a deny).
		nd = s.decide(nf)
		if nd.Allow {
			nd = s.hostAddrCheck(nf, nd)
		}
	}
	if nd.Ask {
		// A profile change while it waits (an answer of always reloads
		// the profile) leaves it to the answer: see recheck.
		lf.mu.Lock()
		lf.held = true
		lf.mu.Unlock()
		nd = s.cfg.Ask(ctx, nf, nd, what)
		lf.mu.Lock()
		lf.held = false
		lf.mu.Unlock()
	}
	if !nd.Allow {
		e.Kind, e.Decision = audit.KindNetRefused, nd
		s.emit(e)
		if sn.Kind == sniff.HTTP {
			answerRefusal(g, what, nd)
			return
		}
		ep.Abort()
		return
	}
	lf.mu.Lock()
	lf.approved = true
	lf.mu.Unlock()
	if c.what != "" {
		lf.addClaims(c)
	}
	e.Decision = nd
	// A forge is reached only through the Git gateway, whose git rules
	// decide every request: an approval opens the network path to it,
	// never a way around them.
	if sn.Kind == sniff.TLS && sn.Hello.HasSNI && s.isForge(nf.Host) {
		if s.serveForge(ctx, g, sn.Prefix, lf, nf, nd, conns) {
			return
		}
	}
	if s.isForge(nf.Host) || sn.Kind == sniff.TLS && !sn.Hello.HasSNI && s.forgeInspect(f) && f.Dst.Port() == 443 {
		e.Kind, e.Decision = audit.KindNetRefused, policy.Decision{Rule: RuleForgeHTTP, Reason: "a Git forge is reached only by HTTPS naming it, through the Git gateway (approved by " + nd.Rule + ")"}
		s.emit(e)
		if sn.Kind == sniff.HTTP {
			answerRefusal(g, what, e.Decision)
			return
		}
		ep.Abort()
		return
	}
	start := time.Now()
	dctx, dcancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	up, err := s.cfg.Dial(dctx, "tcp", f.Dst.String())
	dcancel()
	if err != nil {
		ep.Abort()
		e.Duration, e.Err = time.Since(start), "dial: "+err.Error()
		s.emit(e)
		return
	}
	if !conns.addUp(up) {
		return
	}
	if _, err := up.Write(sn.Prefix); err != nil {
		ep.Abort()
		up.Close()
		e.Duration, e.Err = time.Since(start), "upstream: "+err.Error()
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

// askedOK reports whether the host user allowed name claim c on this
// flow once (it is asked about again on a new flow).
func (f *liveFlow) askedOK(c claim) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, a := range f.asked {
		if a.name == c.name && a.port == c.port {
			return true
		}
	}
	return false
}

// unasked is cs without the claims the host user allowed on f.
func (f *liveFlow) unasked(cs []claim) []claim {
	var out []claim
	for _, c := range cs {
		if !f.askedOK(c) {
			out = append(out, c)
		}
	}
	return out
}

// heldName is the flow as its first bytes name it, the words of the
// question, and the claim it rests on (what is "" when the bytes named
// nothing and the flow is asked about by address or looked-up name).
func heldName(f Flow, sn sniff.Result) (Flow, string, claim) {
	port := strconv.Itoa(int(f.Dst.Port()))
	switch {
	case sn.Kind == sniff.TLS && sn.Hello.HasSNI:
		c := claim{claimSNI, sn.Hello.SNI, f.Dst.Port(), f.Dst.Addr()}
		nf := c.flow(f)
		return nf, "TLS to " + nf.Host + ":" + port + " (" + f.Dst.Addr().String() + ")", c
	case sn.Kind == sniff.HTTP && sn.Connect == "" && len(sn.Hosts) > 0:
		if c, ok := hostClaim(f, sn.Hosts[0]); ok {
			nf := c.flow(f)
			target := sn.Target
			if !strings.HasPrefix(target, "/") {
				target = "/"
			}
			if i := strings.IndexByte(target, '?'); i >= 0 {
				target = target[:i] // the query may carry secrets; the path is what is asked
			}
			host := nf.Host
			if port != "80" {
				host = net.JoinHostPort(host, port)
			}
			return nf, sn.Method + " http://" + host + target, c
		}
	}
	name := f.Host
	if name == "" {
		name = f.Dst.Addr().String()
	}
	return f, f.Proto + " " + name + ":" + port, claim{}
}
