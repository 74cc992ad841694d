package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// route says where a new flow to dst goes: the address to dial from the
// host, or a refusal by the gateway itself. It also fills in f.Host for
// host ports. It does not ask the policy.
func (s *Stack) route(f *Flow) (dial string, refusal *policy.Decision) {
	dst := f.Dst
	if s.isGateway(dst.Addr()) {
		if hp, ok := s.cfg.HostPorts[dst.Port()]; ok && f.Proto == ProtoTCP {
			f.Host = HostInternal
			return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(hp))), nil
		}
		return "", &policy.Decision{Rule: RuleGatewayPort, Reason: "nothing is served on " + f.Proto + " port " +
			strconv.Itoa(int(dst.Port())) + " of the gateway"}
	}
	if p := dst.Port(); p == 53 || p == 853 {
		return "", &policy.Decision{Rule: RuleOtherResolver, Reason: "DNS goes to the gateway " +
			s.cfg.GatewayIP.String() + "; other resolvers are closed"}
	}
	return dst.String(), nil
}

// judge asks the policy about f. A flow to an address our DNS answered is
// judged with the name it was answered for: the newest such name the policy
// allows, else the newest name. Without such a name only IP rules apply.
func (s *Stack) judge(f *Flow) policy.Decision {
	if f.Host != "" {
		return s.decide(*f)
	}
	names := s.names.lookup(f.Dst.Addr(), time.Now())
	if len(names) == 0 {
		return s.decide(*f)
	}
	var first policy.Decision
	for i, n := range names {
		g := *f
		g.Host = n
		d := s.decide(g)
		if d.Allow {
			*f = g
			return d
		}
		if i == 0 {
			first = d
		}
	}
	f.Host = names[0]
	return first
}

// hostAddrCheck refuses an allowed flow whose destination is an address
// of the host itself (see hostaddr.go); it returns d otherwise.
func (s *Stack) hostAddrCheck(f Flow, d policy.Decision) policy.Decision {
	if f.Host == HostInternal || !hostAddrFunc(f.Dst.Addr()) {
		return d
	}
	return policy.Decision{Rule: RuleHostAddr, Reason: f.Proto + " " + f.Dst.Addr().String() +
		" is an address of this host, closed like loopback whatever the profile says; host services are reachable only as " +
		HostInternal + ":PORT for the ports in network.host_ports"}
}

func (s *Stack) handleTCP(r *tcp.ForwarderRequest) {
	id := r.ID()
	f := Flow{Proto: ProtoTCP, Src: addrPort(id.RemoteAddress, id.RemotePort), Dst: addrPort(id.LocalAddress, id.LocalPort)}
	if !s.isGuest(f.Src.Addr()) {
		r.Complete(true)
		return
	}
	if s.cfg.Local != nil && s.isGateway(f.Dst.Addr()) {
		if h := s.cfg.Local(f.Dst.Port()); h != nil {
			s.serveLocal(r, h)
			return
		}
	}
	addr, refusal := s.route(&f)
	if refusal != nil {
		s.refuse(f, *refusal)
		r.Complete(true)
		return
	}
	d := s.judge(&f)
	if d.Allow || d.Ask {
		d = s.hostAddrCheck(f, d)
	}
	if d.Ask && s.cfg.Ask != nil {
		lf := &liveFlow{flow: f, start: time.Now()}
		ctx, cancel := context.WithCancel(s.ctx)
		defer cancel()
		conns := &tcpConns{cancel: cancel}
		lf.stop = conns.abort
		if !s.addFlow(lf) {
			s.refuseMax(f)
			r.Complete(true)
			return
		}
		defer s.removeFlow(lf)
		s.holdTCP(ctx, r, lf, d, conns)
		return
	}
	if !d.Allow {
		s.refuse(f, d)
		if s.explainSSH(r, f, d) || s.explainHTTP(r, f, d) {
			return
		}
		r.Complete(true)
		return
	}
	lf := &liveFlow{flow: f, start: time.Now()}
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	conns := &tcpConns{cancel: cancel}
	lf.stop = conns.abort
	if !s.addFlow(lf) {
		s.refuseMax(f)
		r.Complete(true)
		return
	}
	defer s.removeFlow(lf)
	if s.serveSSH(ctx, r, lf, d, conns) {
		return
	}

	_, hasCred := s.credential(f)
	if isDomainRule(d) || hasCred || s.forgeInspect(f) {
		s.inspectTCP(ctx, r, lf, d, isDomainRule(d), conns)
		return
	}

	// Dial first: the guest's SYN is answered only once the destination
	// has accepted, so a refused or unreachable upstream is a RST, not an
	// accept followed by a close.
	dctx, dcancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	up, err := s.cfg.Dial(dctx, "tcp", addr)
	dcancel()
	if err != nil {
		r.Complete(true)
		s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, Duration: time.Since(lf.start), Err: "dial: " + err.Error()})
		return
	}
	if !conns.addUp(up) {
		r.Complete(true)
		s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, Duration: time.Since(lf.start), Err: errClosedEarly})
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		up.Close()
		r.Complete(true)
		s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, Duration: time.Since(lf.start), Err: "guest handshake: " + terr.String()})
		return
	}
	r.Complete(false)
	ep.SocketOptions().SetKeepAlive(true)
	g := gonet.NewTCPConn(&wq, ep)
	if !conns.setGuest(ep) {
		// Reevaluate or Close ran during the dial or the handshake: the
		// flow was allowed and may have been seen open by the guest, so
		// it gets its summary like any other.
		s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, Duration: time.Since(lf.start), Err: errClosedEarly})
		return
	}

	out, in, err := splice(g, up)
	e := Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, BytesOut: out, BytesIn: in, Duration: time.Since(lf.start)}
	if err != nil {
		e.Err = err.Error()
	}
	s.emit(e)
}

// errClosedEarly ends the summary of a flow the gateway closed (a profile
// change, or the sandbox stopping) before its two ends were joined.
const errClosedEarly = "closed by the gateway before the flow started"

// tcpConns holds the two ends of a TCP flow so that Reevaluate and Close
// can abort it at any stage.
type tcpConns struct {
	cancel  context.CancelFunc
	mu      sync.Mutex
	guest   tcpip.Endpoint
	ups     []net.Conn
	aborted bool
}

// abort resets the guest's end (RST) and closes every upstream conn.
func (c *tcpConns) abort() {
	c.cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.aborted = true
	if c.guest != nil {
		c.guest.Abort()
	}
	for _, u := range c.ups {
		u.Close()
	}
}

// setGuest records the guest's endpoint; after an abort it resets it at
// once and reports false.
func (c *tcpConns) setGuest(ep tcpip.Endpoint) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.guest = ep
	if c.aborted {
		ep.Abort()
		for _, u := range c.ups {
			u.Close()
		}
		return false
	}
	return true
}

// addUp records an upstream conn; after an abort it closes it and reports
// false.
func (c *tcpConns) addUp(u net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.aborted {
		u.Close()
		return false
	}
	c.ups = append(c.ups, u)
	return true
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

type closeWriter interface{ CloseWrite() error }

// splice copies both ways until both directions have ended, passing each
// end-of-stream on as a half-close. It closes both conns before returning
// and reports bytes guest→upstream, upstream→guest and the first error
// that was not a clean end of stream or a close by the other direction.
func splice(guest, up net.Conn) (out, in int64, err error) {
	var (
		firstErr atomic.Pointer[error]
		wg       sync.WaitGroup
		once     sync.Once
	)
	closeBoth := func() { once.Do(func() { guest.Close(); up.Close() }) }
	cp := func(dst, src net.Conn, n *int64) {
		defer wg.Done()
		bp := copyBufs.Get().(*[]byte)
		defer copyBufs.Put(bp)
		var cerr error
		*n, cerr = io.CopyBuffer(dst, src, *bp)
		if cerr != nil {
			if !errors.Is(cerr, net.ErrClosed) {
				firstErr.CompareAndSwap(nil, &cerr)
			}
			closeBoth()
			return
		}
		if cw, ok := dst.(closeWriter); ok {
			if cw.CloseWrite() == nil {
				return
			}
		}
		closeBoth()
	}
	wg.Add(2)
	go cp(up, guest, &out)
	go cp(guest, up, &in)
	wg.Wait()
	closeBoth()
	if p := firstErr.Load(); p != nil {
		err = *p
	}
	return out, in, err
}

// serveLocal hands a guest connection to an in-process service
// (Config.Local) until the service returns.
func (s *Stack) serveLocal(r *tcp.ForwarderRequest, h func(net.Conn)) {
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		return
	}
	r.Complete(false)
	c := gonet.NewTCPConn(&wq, ep)
	stop := context.AfterFunc(s.ctx, func() { c.Close() })
	defer stop()
	h(c)
}
