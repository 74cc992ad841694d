package netstack

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// deniedHold is how long a refused UDP session stays refused without asking
// the policy (and logging) again: a client retrying every second would
// otherwise fill the log.
const deniedHold = 10 * time.Second

type sessionKey struct{ src, dst netip.AddrPort }

// deniedCache remembers refused UDP sessions, and their refusal, for
// deniedHold.
type deniedCache struct {
	mu sync.Mutex
	m  map[sessionKey]deniedEntry
}

type deniedEntry struct {
	exp time.Time
	e   Event
}

func (c *deniedCache) hit(k sessionKey, now time.Time) (Event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.m[k]
	return d.e, ok && now.Before(d.exp)
}

func (c *deniedCache) add(k sessionKey, now time.Time, e Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[sessionKey]deniedEntry{}
	}
	if len(c.m) >= 4096 {
		for k, d := range c.m {
			if !now.Before(d.exp) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= 4096 {
			clear(c.m)
		}
	}
	c.m[k] = deniedEntry{now.Add(deniedHold), e}
}

// refuseUDP records a refused datagram: one record per session per second,
// with how many datagrams it stands for, while the session stays refused.
func (s *Stack) refuseUDP(key sessionKey, f Flow, d policy.Decision, now time.Time) {
	e := Event{Kind: audit.KindNetRefused, Flow: f, Decision: d}
	s.denied.add(key, now, e)
	s.emitSummarized("udp|"+key.src.String()+"|"+key.dst.String(), e)
}

func (c *deniedCache) reset() {
	c.mu.Lock()
	clear(c.m)
	c.mu.Unlock()
}

// handleUDP runs on the packet path for a datagram that belongs to no
// session yet. It decides at once; an allowed session's endpoint is created
// here (so this first datagram is queued on it) and the upstream is dialled
// in the session's goroutine.
func (s *Stack) handleUDP(r *udp.ForwarderRequest) bool {
	id := r.ID()
	f := Flow{Proto: ProtoUDP, Src: addrPort(id.RemoteAddress, id.RemotePort), Dst: addrPort(id.LocalAddress, id.LocalPort)}
	if !s.isGuest(f.Src.Addr()) {
		return true
	}
	now := time.Now()
	key := sessionKey{f.Src, f.Dst}
	if e, ok := s.denied.hit(key, now); ok {
		e.Time = time.Time{}
		s.emitSummarized("udp|"+key.src.String()+"|"+key.dst.String(), e)
		return true
	}
	addr, refusal := s.route(&f)
	if refusal != nil {
		s.refuseUDP(key, f, *refusal, now)
		return true
	}
	d := s.judge(&f)
	if d.Allow || d.Ask {
		d = s.hostAddrCheck(f, d)
	}
	held := d.Ask && s.cfg.Ask != nil
	if !d.Allow && !held {
		s.refuseUDP(key, f, d, now)
		return true
	}
	lf := &liveFlow{flow: f, start: now}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		return true
	}
	if held {
		// What waits for the answer is bounded by the session's receive
		// buffer; relaying gets the usual one back (holdUDP).
		lf.rcvBuf = ep.SocketOptions().GetReceiveBufferSize()
		ep.SocketOptions().SetReceiveBufferSize(udpHeldBuffer, false)
	}
	guest := gonet.NewUDPConn(&wq, ep)
	ctx, cancel := context.WithCancel(s.ctx)
	var (
		mu sync.Mutex
		up net.Conn
	)
	lf.stop = func() {
		cancel()
		guest.Close()
		mu.Lock()
		if up != nil {
			up.Close()
		}
		mu.Unlock()
	}
	if !s.addFlow(lf) {
		guest.Close()
		cancel()
		s.denied.add(key, now, Event{Kind: audit.KindNetRefused, Flow: f, Decision: s.maxFlowsDecision()})
		s.refuseMax(f)
		return true
	}
	go func() {
		defer s.removeFlow(lf)
		defer lf.abort()
		if held {
			var ok bool
			if d, ok = s.holdUDP(ctx, key, lf, d); !ok {
				return
			}
			ep.SocketOptions().SetReceiveBufferSize(lf.rcvBuf, false)
		}
		dctx, dcancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
		c, err := s.cfg.Dial(dctx, "udp", addr)
		dcancel()
		if err != nil {
			s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, Duration: time.Since(lf.start), Err: "dial: " + err.Error()})
			return
		}
		mu.Lock()
		up = c
		mu.Unlock()
		if ctx.Err() != nil {
			c.Close()
			return
		}
		out, in := s.relayUDP(guest, c)
		s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, BytesOut: out, BytesIn: in, Duration: time.Since(lf.start)})
	}()
	return true
}

// udpHeldBuffer bounds the datagrams a held UDP session keeps (payload
// bytes; a datagram arriving once it is full is dropped).
const udpHeldBuffer = 16 << 10

// holdUDP puts a UDP session the policy says ask about to the host user
// (Config.Ask), in the session's goroutine, before anything is dialled.
// The guest's datagrams wait on the session's endpoint, which holds at
// most udpHeldBuffer (later ones are dropped, as a full socket drops
// them), and are relayed in order once allowed. Refused,
// the session is refused as one the policy refused (deniedHold), so a
// client retrying is not asked about again at once.
func (s *Stack) holdUDP(ctx context.Context, key sessionKey, lf *liveFlow, d policy.Decision) (policy.Decision, bool) {
	f := lf.flow
	what := f.Proto + " " + f.Dst.Addr().String() + ":" + strconv.Itoa(int(f.Dst.Port()))
	if f.Host != "" {
		what = f.Proto + " " + f.Host + ":" + strconv.Itoa(int(f.Dst.Port())) + " (" + f.Dst.Addr().String() + ")"
	}
	lf.mu.Lock()
	lf.held = true
	lf.mu.Unlock()
	nd := s.cfg.Ask(ctx, f, d, what)
	lf.mu.Lock()
	lf.held = false
	lf.approved = nd.Allow
	lf.mu.Unlock()
	if !nd.Allow {
		if ctx.Err() == nil {
			s.refuseUDP(key, f, nd, time.Now())
		}
		return nd, false
	}
	return nd, true
}

// relayUDP copies datagrams both ways until neither way has seen one for
// UDPIdleTimeout, or either side fails.
func (s *Stack) relayUDP(guest, up net.Conn) (out, in int64) {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	idle := s.cfg.UDPIdleTimeout
	var wg sync.WaitGroup
	var once sync.Once
	stop := func() { once.Do(func() { guest.Close(); up.Close() }) }
	cp := func(dst, src net.Conn, n *int64) {
		defer wg.Done()
		defer stop()
		buf := make([]byte, 65535)
		for {
			src.SetReadDeadline(time.Unix(0, last.Load()).Add(idle))
			k, err := src.Read(buf)
			if err != nil {
				if errors.Is(err, os.ErrDeadlineExceeded) || isTimeout(err) {
					if time.Since(time.Unix(0, last.Load())) < idle {
						continue // the other direction was active
					}
				}
				return
			}
			last.Store(time.Now().UnixNano())
			if _, err := dst.Write(buf[:k]); err != nil && !isTransient(err) {
				return
			}
			*n += int64(k)
		}
	}
	wg.Add(2)
	go cp(up, guest, &out)
	go cp(guest, up, &in)
	wg.Wait()
	return out, in
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// isTransient reports errors after which a UDP session goes on: an ICMP
// port unreachable from the destination surfaces as ECONNREFUSED on the
// next write.
func isTransient(err error) bool {
	var oe *net.OpError
	if errors.As(err, &oe) {
		var se *os.SyscallError
		if errors.As(oe.Err, &se) {
			return se.Syscall == "write" || se.Syscall == "sendto"
		}
	}
	return false
}
