// Package netstack is a sandbox's user-mode network gateway: a gVisor
// tcpip stack in the supervisor that is the only other end of the guest's
// virtio-net NIC (QEMU `-netdev dgram` on a SOCK_DGRAM socketpair, one
// Ethernet frame per datagram).
//
// Nothing is routed. The stack accepts every TCP connection and UDP session
// the guest opens, whatever the destination address (promiscuous mode and
// spoofing, as tailscale's netstack and gvisor-tap-vsock do), asks the policy
// about each new flow, and for an allowed flow dials the destination from
// the host and splices the two. The gateway address also serves DNS, which
// resolves only the names the policy lets resolve and remembers which name
// each answered address was for, so a later connection to that address is
// judged by the name's domain rules.
//
// Lifecycle: New starts everything; Close stops it and closes every flow.
// SetPolicy swaps the policy for new flows; Reevaluate then closes live
// flows the new policy refuses. Events for the audit log are delivered to
// Config.Log from a single goroutine, in order; a Log that is too slow loses
// events (counted in Stats) rather than stalling the guest's network.
package netstack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/usage"
)

// Config describes one sandbox's network.
type Config struct {
	// GuestIP and GatewayIP are the guest's and the gateway's IPv4
	// addresses in one /PrefixLen subnet, e.g. 10.0.2.15 and 10.0.2.2.
	GuestIP, GatewayIP netip.Addr
	PrefixLen          int // 0 means 24
	// GuestIPv6 and GatewayIPv6 enable IPv6 when both are set (e.g.
	// fd00:5c::15 and fd00:5c::2 in a /64). Without them IPv6 frames are
	// dropped unanswered, so the guest falls back to IPv4.
	GuestIPv6, GatewayIPv6 netip.Addr

	// MAC is the guest NIC's address (vm.NetDgram.MAC). When set, the
	// gateway knows it statically and never needs ARP or NDP to reach
	// the guest. GatewayMAC is the gateway's; empty means 52:55:0a:00:02:02.
	MAC, GatewayMAC net.HardwareAddr
	MTU             int // 0 means 1500

	// Policy decides every new flow and every name lookup. nil refuses
	// everything. See SetPolicy.
	Policy PolicyFunc
	// Dial dials allowed destinations from the host ("tcp" or "udp",
	// "IP:PORT"). nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialTimeout bounds Dial; 0 means 10 s. The guest's SYN is answered
	// only after the dial succeeds, so a refused upstream is a RST.
	DialTimeout time.Duration
	// Resolver resolves the names the policy lets resolve. nil means
	// net.DefaultResolver.
	Resolver Resolver
	// Log receives refusals and flow summaries, from one goroutine.
	Log func(Event)
	// HostPorts maps host.smx.internal:PORT (the gateway address) to host
	// loopback ports. Only these ever reach host loopback.
	HostPorts map[uint16]uint16
	// Local returns the in-process service for a TCP connection from the
	// guest to GatewayIP:port (the file gateway's 9P), or nil. Such
	// connections are served by the supervisor itself, which decides
	// every request they carry; they are not network flows, so they are
	// neither decided by Policy nor logged as flows.
	Local func(port uint16) func(net.Conn)
	// MaxFlows bounds live TCP connections plus UDP sessions; 0 means 1024.
	// Flows over the bound are refused and logged.
	MaxFlows int
	// UDPRate bounds the UDP packets per second the guest may send
	// (including DNS); 0 means 5000, negative means no limit. Excess
	// packets are dropped; drops are logged once per RateLogInterval.
	UDPRate         int
	RateLogInterval time.Duration // 0 means 10 s
	// UDPIdleTimeout closes a UDP session with no packet either way; 0
	// means 60 s.
	UDPIdleTimeout time.Duration
	// DNSTTL is the TTL of our answers; 0 means 60 s. An answered
	// name ↔ address mapping is kept for DNSTTL + DNSGrace (0 means 1 h),
	// because programs keep addresses longer than the TTL says.
	DNSTTL, DNSGrace time.Duration

	// PeekTimeout bounds how long the gateway waits for the first bytes
	// of a flow it must inspect (one allowed by a domain rule, or one to a
	// name with a credential bound); 0 means 60 s. A guest that sends
	// nothing in time is refused. Nothing goes upstream before the first
	// bytes are decided, and MaxFlows bounds the flows waiting, so the
	// wait is long: a loaded guest under TCG has taken more than 10 s
	// between its connect and its ClientHello (git over HTTPS loading its
	// CA bundle). See inspect.go.
	PeekTimeout time.Duration

	// Credentials says which credential, if any, is bound to an allowed
	// flow's name (ProfileCredentials). nil means none: nothing is
	// brokered. See SetCredentials.
	Credentials CredentialFunc
	// Secret reads a credential's value from the host store by name
	// (creds.Store.Get).
	Secret func(name string) ([]byte, error)
	// CA issues the leaf certificates the gateway shows the guest for a
	// brokered name. Without it a flow with a credential bound is refused.
	CA LeafIssuer
	// UpstreamRoots verifies brokered upstreams; nil means the system
	// roots. It is a host-side setting (tests add their own root), never
	// taken from a profile or the guest.
	UpstreamRoots *x509.CertPool
	// Meter counts what brokered model requests cost (usage.go): each
	// answer's usage is read as it passes and recorded as cred.usage.
	// nil means no accounting, except for credentials with a budget,
	// which are then counted in memory only.
	Meter *usage.Meter
	// Forge takes TLS flows to Git forges (see forge.go); nil means none.
	Forge ForgeGateway
	// AskCredential holds a brokered request whose credential binding
	// says ask (policy.Credential.Ask) and puts it to the host user,
	// before the secret is used; nil refuses such requests. what names
	// the question.
	AskCredential func(ctx context.Context, f Flow, cred policy.Credential, what string) (allow bool, reason string)
	// AskBudget holds a brokered request past a budget that says ask
	// (policy.Budget.Ask) and puts it to the host user; what names the
	// request and the cap it is past. allow lets this request go on; lift
	// says the answer lifts the budget for the sandbox's life (later
	// requests are counted, never stopped by it, and not asked about).
	// nil refuses such requests as any past a budget.
	AskBudget func(ctx context.Context, f Flow, cred policy.Credential, what string) (allow, lift bool, reason string)
	// Ask holds a TCP flow (hold.go) or UDP session (udp.go) the policy
	// says ask about (Decision.Ask) and puts it to the host user; nil
	// refuses such flows, as everything else that is not allowed. A name
	// lookup is never asked about: a name under ask is resolved, and the
	// flow to it asked about.
	Ask AskFunc
	// Activity, when set, is called for each TCP or UDP packet the guest
	// sends that the link admits and for each packet sent to the guest
	// (the supervisor's --idle-stop); it must be cheap.
	Activity func()
}

// LeafIssuer issues TLS certificates for names (tlsgw.CA). It must be safe
// for concurrent use.
type LeafIssuer interface {
	Leaf(name string) (*tls.Certificate, error)
}

// CredentialFunc returns the credential bound to a flow's name, if any.
// Like a PolicyFunc it must be quick and safe for concurrent use.
type CredentialFunc func(Flow) (policy.Credential, bool)

// ProfileCredentials adapts a profile's credentials to a CredentialFunc.
func ProfileCredentials(p *policy.Profile) CredentialFunc {
	return func(f Flow) (policy.Credential, bool) { return p.CredentialFor(f.Request()) }
}

// Stack is one sandbox's network gateway. Its methods are safe for
// concurrent use.
type Stack struct {
	cfg    Config
	ctx    context.Context
	cancel context.CancelFunc
	st     *stack.Stack
	link   *filterEndpoint
	fd     int

	policy atomic.Pointer[PolicyFunc]
	creds  atomic.Pointer[CredentialFunc]
	// budgetMeter is cfg.Meter, or an in-memory one for budgets when
	// there is none.
	budgetMeter *usage.Meter
	// lifted holds the credentials whose budget the host user lifted for
	// the sandbox's life (an answer of sandbox to a budget's ask).
	lifted sync.Map                // credential name → struct{}
	ssh    atomic.Pointer[sshHook] // see sshflow.go
	names  *nameMap
	dns    []interface{ Shutdown() error }

	mu    sync.Mutex
	flows map[*liveFlow]struct{}

	events     chan Event
	eventsLost atomic.Int64
	udpDropped atomic.Int64
	denied     deniedCache
	sums       summaries

	flowWG    sync.WaitGroup // live flows
	wg        sync.WaitGroup // the event pump and the drop reporter
	pumpStop  chan struct{}
	closeOnce sync.Once
}

// Stats are counters for tests and diagnostics.
type Stats struct {
	Flows      int   // live TCP connections and UDP sessions
	UDPDropped int64 // UDP packets dropped by the rate limit, ever
	EventsLost int64 // events not delivered because Log was too slow
}

const nicID tcpip.NICID = 1

// New starts the gateway on link, the host end of the SOCK_DGRAM socketpair
// whose other end QEMU holds. New duplicates link's descriptor: the caller
// may close link once New returns. Errors are errdefs.ErrInvalid for a bad
// Config.
func New(cfg Config, link *os.File) (*Stack, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("netstack: %w: %v", errdefs.ErrInvalid, err)
	}
	fd, err := dupFD(link)
	if err != nil {
		return nil, fmt.Errorf("netstack: link: %w", err)
	}
	s := &Stack{
		cfg:      cfg,
		fd:       fd,
		names:    newNameMap(),
		flows:    map[*liveFlow]struct{}{},
		events:   make(chan Event, 1024),
		pumpStop: make(chan struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	if s.budgetMeter = cfg.Meter; s.budgetMeter == nil {
		s.budgetMeter, _ = usage.NewMeter("", nil)
	}
	s.SetPolicy(cfg.Policy)
	s.SetCredentials(cfg.Credentials)
	if err := s.start(); err != nil {
		s.Close()
		return nil, fmt.Errorf("netstack: %w", err)
	}
	return s, nil
}

func (c *Config) setDefaults() error {
	if !c.GuestIP.Is4() || !c.GatewayIP.Is4() {
		return errors.New("GuestIP and GatewayIP must be IPv4 addresses")
	}
	if c.PrefixLen == 0 {
		c.PrefixLen = 24
	}
	pfx := netip.PrefixFrom(c.GatewayIP, c.PrefixLen).Masked()
	if c.PrefixLen < 8 || c.PrefixLen > 30 || !pfx.Contains(c.GuestIP) || c.GuestIP == c.GatewayIP {
		return fmt.Errorf("GuestIP %v and GatewayIP %v must be distinct addresses in one /8../30 subnet", c.GuestIP, c.GatewayIP)
	}
	if c.GuestIPv6.IsValid() != c.GatewayIPv6.IsValid() ||
		c.GuestIPv6.IsValid() && (!c.GuestIPv6.Is6() || !c.GatewayIPv6.Is6() || c.GuestIPv6.Is4In6() || c.GuestIPv6 == c.GatewayIPv6) {
		return errors.New("GuestIPv6 and GatewayIPv6 must both be distinct IPv6 addresses, or both unset")
	}
	if c.MAC != nil && len(c.MAC) != 6 {
		return fmt.Errorf("MAC %v: want 6 bytes", c.MAC)
	}
	if c.GatewayMAC == nil {
		c.GatewayMAC = net.HardwareAddr{0x52, 0x55, 0x0a, 0x00, 0x02, 0x02}
	} else if len(c.GatewayMAC) != 6 {
		return fmt.Errorf("GatewayMAC %v: want 6 bytes", c.GatewayMAC)
	}
	if c.MTU == 0 {
		c.MTU = 1500
	}
	if c.MTU < 1280 || c.MTU > 65000 {
		return fmt.Errorf("MTU %d: want 1280..65000", c.MTU)
	}
	if c.Dial == nil {
		c.Dial = (&net.Dialer{}).DialContext
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	if c.MaxFlows == 0 {
		c.MaxFlows = 1024
	}
	if c.UDPRate == 0 {
		c.UDPRate = 5000
	}
	if c.RateLogInterval == 0 {
		c.RateLogInterval = 10 * time.Second
	}
	if c.UDPIdleTimeout == 0 {
		c.UDPIdleTimeout = 60 * time.Second
	}
	if c.DNSTTL == 0 {
		c.DNSTTL = 60 * time.Second
	}
	if c.DNSGrace == 0 {
		c.DNSGrace = time.Hour
	}
	if c.PeekTimeout == 0 {
		c.PeekTimeout = 60 * time.Second
	}
	for gp, hp := range c.HostPorts {
		if gp == 0 || hp == 0 {
			return errors.New("HostPorts: port 0")
		}
		if gp == 53 {
			return errors.New("HostPorts: port 53 is the gateway's DNS")
		}
	}
	return nil
}

func (s *Stack) v6() bool { return s.cfg.GuestIPv6.IsValid() }

func (s *Stack) start() error {
	nets := []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol}
	if s.v6() {
		nets = append(nets, ipv6.NewProtocol)
	}
	s.st = stack.New(stack.Options{
		NetworkProtocols:   nets,
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
	})
	opts := []tcpip.SettableTransportProtocolOption{
		new(tcpip.TCPSACKEnabled),
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20},
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20},
	}
	*opts[0].(*tcpip.TCPSACKEnabled) = true
	for _, o := range opts {
		if err := s.st.SetTransportProtocolOption(tcp.ProtocolNumber, o); err != nil {
			return fmt.Errorf("tcp option %T: %v", o, err)
		}
	}
	mro := tcpip.TCPModerateReceiveBufferOption(true)
	if err := s.st.SetTransportProtocolOption(tcp.ProtocolNumber, &mro); err != nil {
		return fmt.Errorf("tcp option %T: %v", mro, err)
	}

	link, err := newLink(s, s.fd)
	if err != nil {
		return err
	}
	s.link = link
	if err := s.st.CreateNICWithOptions(nicID, link, stack.NICOptions{Name: "smx0"}); err != nil {
		return fmt.Errorf("create NIC: %v", err)
	}
	if err := s.st.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpAddr(s.cfg.GatewayIP), PrefixLen: s.cfg.PrefixLen},
	}, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("gateway address: %v", err)
	}
	routes := []tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}}
	if s.v6() {
		if err := s.st.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
			Protocol:          ipv6.ProtocolNumber,
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpAddr(s.cfg.GatewayIPv6), PrefixLen: 64},
		}, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("gateway IPv6 address: %v", err)
		}
		routes = append(routes, tcpip.Route{Destination: header.IPv6EmptySubnet, NIC: nicID})
	}
	s.st.SetRouteTable(routes)
	// Accept packets for every destination and answer from it: every
	// address is "the gateway", and the forwarders decide.
	if err := s.st.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("promiscuous: %v", err)
	}
	if err := s.st.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("spoofing: %v", err)
	}
	if s.cfg.MAC != nil {
		mac := tcpip.LinkAddress(s.cfg.MAC)
		if err := s.st.AddStaticNeighbor(nicID, ipv4.ProtocolNumber, tcpAddr(s.cfg.GuestIP), mac); err != nil {
			return fmt.Errorf("static neighbour: %v", err)
		}
		if s.v6() {
			if err := s.st.AddStaticNeighbor(nicID, ipv6.ProtocolNumber, tcpAddr(s.cfg.GuestIPv6), mac); err != nil {
				return fmt.Errorf("static neighbour: %v", err)
			}
		}
	}

	tcpFwd := tcp.NewForwarder(s.st, 0, 1024, s.handleTCP)
	s.st.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	udpFwd := udp.NewForwarder(s.st, s.handleUDP)
	s.st.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)

	if err := s.startDNS(); err != nil {
		return err
	}
	s.wg.Add(3)
	go s.pumpEvents()
	go s.reportDrops()
	go s.summarize()
	return nil
}

// Close stops the gateway: DNS, every flow, the stack and the link. It is
// idempotent and returns once every goroutine the Stack started has ended.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.cancel() // under mu: addFlow never adds to wg after this
		s.mu.Unlock()
		for _, d := range s.dns {
			_ = d.Shutdown()
		}
		s.mu.Lock()
		flows := make([]*liveFlow, 0, len(s.flows))
		for f := range s.flows {
			flows = append(flows, f)
		}
		s.mu.Unlock()
		for _, f := range flows {
			f.abort()
		}
		if s.link != nil {
			s.link.w.closed.Store(true)
		}
		if s.st != nil {
			s.st.Close()
			s.st.Wait() // removes the NIC, which stops the link's reader
		}
		s.flowWG.Wait() // their summaries are queued now
		s.flushSummaries()
		close(s.pumpStop)
		s.wg.Wait()
		closeFD(s.fd)
	})
	return nil
}

// SetPolicy replaces the policy for new flows and lookups. Live flows keep
// running; call Reevaluate to close those the new policy refuses. nil
// refuses everything.
func (s *Stack) SetPolicy(p PolicyFunc) {
	if p == nil {
		p = func(Flow) policy.Decision {
			return policy.Decision{Rule: RuleNoPolicy, Reason: "the sandbox has no network policy"}
		}
	}
	s.policy.Store(&p)
}

// SetCredentials replaces the credential bindings for new flows (flows
// being brokered keep theirs until they end). nil means none.
func (s *Stack) SetCredentials(c CredentialFunc) { s.creds.Store(&c) }

func (s *Stack) decide(f Flow) policy.Decision { return (*s.policy.Load())(f) }

// Reevaluate asks the current policy about every live flow, with
// everything its first decision used (the names its TLS server name, HTTP
// Host or CONNECT target gave), and closes (RST for TCP) those it refuses,
// logging each as a refusal. It returns how many it closed.
func (s *Stack) Reevaluate() int {
	s.mu.Lock()
	flows := make([]*liveFlow, 0, len(s.flows))
	for f := range s.flows {
		flows = append(flows, f)
	}
	s.mu.Unlock()
	n := 0
	for _, f := range flows {
		d, c := s.recheck(f)
		if d == nil {
			continue
		}
		d.Reason = "policy changed: " + d.Reason
		e := Event{Kind: audit.KindNetRefused, Flow: f.flow, Decision: *d}
		switch c.what {
		case claimSNI:
			e.SNI = c.name
		case claimHost:
			e.HTTPHost = c.name
		case claimConnect:
			e.Connect = net.JoinHostPort(c.name, strconv.Itoa(int(c.port)))
		}
		s.emit(e)
		f.abort()
		n++
	}
	s.denied.reset()
	return n
}

// Stats returns the current counters.
func (s *Stack) Stats() Stats {
	s.mu.Lock()
	n := len(s.flows)
	s.mu.Unlock()
	return Stats{Flows: n, UDPDropped: s.udpDropped.Load(), EventsLost: s.eventsLost.Load()}
}

// liveFlow is a TCP connection or UDP session counted against MaxFlows.
type liveFlow struct {
	flow  Flow
	start time.Time
	once  sync.Once
	stop  func() // aborts both ends; called once

	mu        sync.Mutex
	claims    []claim // names the flow's bytes carried (inspect.go)
	inspected bool    // its bytes were read before it was dialled
	forge     bool    // the Git gateway serves it (forge.go)
	approved  bool    // the host user allowed it once (hold.go); a profile change keeps it
	held      bool    // it waits for the host user's answer (hold.go), which decides it
	rcvBuf    int64   // a held UDP session's receive buffer before the hold (udp.go)
	asked     []claim // names on it the host user allowed once (inspect.go)
}

func (f *liveFlow) abort() { f.once.Do(f.stop) }

// addFlow registers a flow, or reports false if MaxFlows are live or the
// Stack is closing. A registered flow counts in s.flowWG until removeFlow, so
// Close waits for it.
func (s *Stack) addFlow(f *liveFlow) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.flows) >= s.cfg.MaxFlows || s.ctx.Err() != nil {
		return false
	}
	s.flows[f] = struct{}{}
	s.flowWG.Add(1)
	return true
}

func (s *Stack) removeFlow(f *liveFlow) {
	s.mu.Lock()
	delete(s.flows, f)
	s.mu.Unlock()
	s.flowWG.Done()
}

func (s *Stack) emit(e Event) {
	if s.cfg.Log == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	select {
	case s.events <- e:
	default:
		s.eventsLost.Add(1)
	}
}

func (s *Stack) refuse(f Flow, d policy.Decision) {
	s.emit(Event{Kind: audit.KindNetRefused, Flow: f, Decision: d})
}

func (s *Stack) pumpEvents() {
	defer s.wg.Done()
	for {
		select {
		case e := <-s.events:
			s.cfg.Log(e)
		case <-s.pumpStop:
			for {
				select {
				case e := <-s.events:
					s.cfg.Log(e)
				default:
					return
				}
			}
		}
	}
}

func (s *Stack) isGateway(a netip.Addr) bool {
	return a == s.cfg.GatewayIP || s.v6() && a == s.cfg.GatewayIPv6
}

func (s *Stack) isGuest(a netip.Addr) bool {
	return a == s.cfg.GuestIP || s.v6() && a == s.cfg.GuestIPv6
}

func tcpAddr(a netip.Addr) tcpip.Address { return tcpip.AddrFromSlice(a.AsSlice()) }

func netipAddr(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip
}

func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netipAddr(a), port)
}

// refuseMax logs a flow refused because MaxFlows are live; a flow refused
// because the Stack is closing is not logged.
func (s *Stack) refuseMax(f Flow) {
	if s.ctx.Err() != nil {
		return
	}
	s.refuse(f, s.maxFlowsDecision())
}

func (s *Stack) maxFlowsDecision() policy.Decision {
	return policy.Decision{Rule: RuleMaxFlows, Reason: "the sandbox already has " + strconv.Itoa(s.cfg.MaxFlows) + " flows open"}
}

// DialGuest opens a TCP connection from the gateway's address to the
// guest's port: how a port published on the host (internal/publish)
// reaches the guest without the guest being on the host's network. The
// guest sees it come from the gateway. It is not a flow of the guest's,
// so no policy decides it; the caller logs it.
func (s *Stack) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	if s.ctx.Err() != nil {
		return nil, fmt.Errorf("netstack: the gateway is closed: %w", errdefs.ErrUnavailable)
	}
	return gonet.DialContextTCP(ctx, s.st, tcpip.FullAddress{NIC: nicID, Addr: tcpAddr(s.cfg.GuestIP), Port: port}, ipv4.ProtocolNumber)
}
