package netstack

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// SSHHandler terminates one SSH connection the guest opened (the SSH
// gateway, internal/sshgw). f is the flow as judged: f.Host is the name the
// guest looked up, if any, and f.Dst the address it dialled. The handler
// owns guest and must close it; it returns when the connection has ended.
// ctx is cancelled when the flow is closed (profile change, Close).
//
// refusal is non-nil for a flow the policy refused (already logged as
// net.refused): the handler must not reach the destination, only tell the
// guest's SSH client why, in SSH, so the agent can read it.
type SSHHandler func(ctx context.Context, guest net.Conn, f Flow, refusal *policy.Decision)

// RuleNoSSHGateway refuses a flow routed to the SSH gateway when none is
// set.
const RuleNoSSHGateway = "netstack: no ssh gateway"

// WithSSH adds the profile's ssh section to a PolicyFunc: a TCP flow to a
// host and port that an ssh allow rule names (policy.Profile.SSHRoute) is
// allowed by that rule and handed to the SSH handler instead of being
// dialled, so the connection is terminated on the host and each user is
// decided there; a name an ssh allow rule names resolves even if no
// network rule names it. Everything else is decided by inner.
func WithSSH(inner PolicyFunc, p *policy.Profile) PolicyFunc {
	return func(f Flow) policy.Decision {
		switch f.Proto {
		case ProtoTCP:
			if f.Host != HostInternal {
				if d, ok := p.SSHRoute(f.Host, f.Dst.Addr(), f.Dst.Port()); ok {
					return d
				}
			}
		case ProtoDNS:
			d := inner(f)
			if !d.Allow {
				if sd, ok := p.SSHName(f.Host); ok {
					return sd
				}
			}
			return d
		}
		return inner(f)
	}
}

// isSSHRoute reports whether d routes a flow to the SSH gateway (rule
// labels read "FILE:L:C ssh.allow[i] host ...").
func isSSHRoute(d policy.Decision) bool {
	return d.Allow && strings.Contains(d.Rule, " ssh.allow[")
}

// SetSSH sets the SSH gateway flows routed by WithSSH go to; nil refuses
// them. explains says which refused TCP flows the gateway answers in SSH
// instead of a reset (say port 22, or hosts the ssh section names); nil
// means none.
func (s *Stack) SetSSH(h SSHHandler, explains func(Flow) bool) {
	s.ssh.Store(&sshHook{h, explains})
}

type sshHook struct {
	serve    SSHHandler
	explains func(Flow) bool
}

// explainTimeout bounds a refused flow handed to the SSH gateway to explain
// itself, so refused connections cannot pile up.
const explainTimeout = 30 * time.Second

// explainSSH hands a refused TCP flow (already logged) to the SSH gateway,
// which tells the guest's ssh why in its own protocol, and reports whether
// it did. The flow counts against MaxFlows while it lasts; the destination
// is never dialled.
func (s *Stack) explainSSH(r *tcp.ForwarderRequest, f Flow, d policy.Decision) bool {
	hp := s.ssh.Load()
	if hp == nil || hp.serve == nil || hp.explains == nil || !hp.explains(f) {
		return false
	}
	return s.holdRefused(r, f, func(ctx context.Context, g *gonet.TCPConn, _ tcpip.Endpoint) {
		g.SetDeadline(time.Now().Add(explainTimeout))
		hp.serve(ctx, g, f, &d)
		g.Close()
	})
}

// serveSSH hands a flow WithSSH routed to the SSH handler, and reports
// whether it did (or refused it for want of one).
func (s *Stack) serveSSH(ctx context.Context, r *tcp.ForwarderRequest, lf *liveFlow, d policy.Decision, conns *tcpConns) bool {
	if !isSSHRoute(d) {
		return false
	}
	f := lf.flow
	hp := s.ssh.Load()
	if hp == nil || hp.serve == nil {
		s.refuse(f, policy.Decision{Rule: RuleNoSSHGateway, Reason: "ssh to " + f.Dst.String() + " is routed to the SSH gateway, which is not running"})
		r.Complete(true)
		return true
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, Duration: time.Since(lf.start), Err: "guest handshake: " + terr.String()})
		return true
	}
	r.Complete(false)
	ep.SocketOptions().SetKeepAlive(true)
	g := gonet.NewTCPConn(&wq, ep)
	if !conns.setGuest(ep) {
		return true
	}
	cc := &sshCountConn{Conn: g}
	hp.serve(ctx, cc, f, nil)
	cc.Close()
	s.emit(Event{Kind: audit.KindNetFlow, Flow: f, Decision: d, BytesOut: cc.read.Load(), BytesIn: cc.written.Load(),
		Duration: time.Since(lf.start)})
	return true
}

// sshCountConn counts the bytes of the guest's end of an SSH flow.
type sshCountConn struct {
	net.Conn
	read, written atomic.Int64
}

func (c *sshCountConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.read.Add(int64(n))
	return n, err
}

func (c *sshCountConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}
