package netstack

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/smx-dev/smx/internal/netstack/sniff"
	"github.com/smx-dev/smx/internal/policy"
)

// A refused flow is normally reset at the guest's SYN: nothing is said,
// and `curl http://denied.example/` shows only "connection reset", while a
// refused *later* request on an allowed connection is answered 403 with
// the rule (proxyHTTP). For plain HTTP the gateway can say why on the
// first request too, without dialling anything: explainHTTP accepts a
// refused flow to port 80, reads the guest's first bytes and, when they
// are an HTTP request, answers 403 with the rule and a hint (RefusalText)
// and closes; anything else is reset as before. The refusal itself was
// already logged (one net.refused record per flow, as for every refused
// flow). The same goes for a first request that an allowed flow refuses
// by its Host (inspectTCP): it is answered 403 instead of reset.

// explainHTTPPort is the port on which a refused flow is accepted to be
// told why in HTTP; other ports cannot be guessed to carry HTTP before
// the handshake.
const explainHTTPPort = 80

// explainHTTP handles refused flow f to port 80 as described above and
// reports whether it took the flow (false: the caller resets it).
func (s *Stack) explainHTTP(r *tcp.ForwarderRequest, f Flow, d policy.Decision) bool {
	if f.Proto != ProtoTCP || f.Dst.Port() != explainHTTPPort {
		return false
	}
	return s.holdRefused(r, f, func(ctx context.Context, g *gonet.TCPConn, ep tcpip.Endpoint) {
		g.SetReadDeadline(time.Now().Add(s.cfg.PeekTimeout))
		sn, err := sniff.Read(g)
		if err != nil || sn.Kind != sniff.HTTP || ctx.Err() != nil {
			ep.Abort()
			return
		}
		host := f.Dst.String()
		if f.Host != "" {
			host = f.Host
		}
		if len(sn.Hosts) > 0 {
			host = sniff.HostOnly(sn.Hosts[0])
		}
		answerRefusal(g, "request for "+strconv.Quote(host), d)
	})
}

// holdRefused accepts refused flow f without dialling anything and runs
// answer on the guest's side of it, so the gateway itself can tell the
// guest why (a 403, an SSH banner). It reports whether it took the flow
// (false: the flow table is full, the caller resets the flow). A
// flow-table slot bounds how many refused connections are held open at
// once; ctx ends after explainTimeout.
func (s *Stack) holdRefused(r *tcp.ForwarderRequest, f Flow, answer func(ctx context.Context, g *gonet.TCPConn, ep tcpip.Endpoint)) bool {
	lf := &liveFlow{flow: f, start: time.Now()}
	ctx, cancel := context.WithTimeout(s.ctx, explainTimeout)
	defer cancel()
	conns := &tcpConns{cancel: cancel}
	lf.stop = conns.abort
	if !s.addFlow(lf) {
		return false
	}
	defer s.removeFlow(lf)
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		return true
	}
	r.Complete(false)
	g := gonet.NewTCPConn(&wq, ep)
	if !conns.setGuest(ep) {
		return true
	}
	answer(ctx, g, ep)
	return true
}

// answerRefusal answers the guest's plain-HTTP request on g with a 403
// naming the rule, then closes g gently: the write side first, then what
// the guest still sends is read for a moment, so that unread request
// bytes do not turn the close into a reset that loses the answer.
func answerRefusal(g net.Conn, what string, d policy.Decision) {
	body := RefusalText(what, d) + "\n"
	g.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(g, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\n"+
		"Connection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if cw, ok := g.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		g.SetReadDeadline(time.Now().Add(time.Second))
		io.Copy(io.Discard, io.LimitReader(g, 1<<20))
	}
	g.Close()
}
