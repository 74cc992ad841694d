package netstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/testutil"
)

// The test rig: the Stack under test on one end of a SOCK_DGRAM
// socketpair, and on the other a second gVisor stack playing the guest
// (10.0.2.15/24, default route via 10.0.2.2), as QEMU's virtio-net would
// be. Upstreams are real servers on host loopback; the rig's Dial maps the
// fake public destinations the guest uses onto them, because host loopback
// itself is always closed to the guest.

var (
	guestIP    = netip.MustParseAddr("10.0.2.15")
	gatewayIP  = netip.MustParseAddr("10.0.2.2")
	guestIP6   = netip.MustParseAddr("fd00:5c::15")
	gatewayIP6 = netip.MustParseAddr("fd00:5c::2")
	guestMAC   = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
)

const testProfile = `
network:
  mode: default-deny
  allow:
    - domain: allowed.test
      ports: [80]
    - domain: "*.wild.test"
    - cidr: 198.51.100.0/24
      ports: [80, 7, 9]
    - cidr: 2001:db8::/32
      ports: [80]
  deny:
    - domain: blocked.wild.test
  host_ports: [8080]
`

const testHosts = `
203.0.113.5   allowed.test
203.0.113.6   a.wild.test blocked.wild.test
203.0.113.7   unlisted.test
2001:db8::5   allowed.test
`

func mustProfile(t testing.TB, src string) *policy.Profile {
	t.Helper()
	p, err := policy.Parse("test.yaml", []byte(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type rig struct {
	t      testing.TB
	s      *Stack
	guest  *stack.Stack
	gfd    int
	mu     sync.Mutex
	events []Event
	dialed []string
	routes map[string]string // "tcp 198.51.100.10:80" → "127.0.0.1:NNNN"
	lookup map[string]int    // resolver calls per name
}

type rigOpt func(*Config)

func newRig(t testing.TB, opts ...rigOpt) *rig {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Large socket buffers, as for QEMU's end.
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	r := &rig{t: t, gfd: fds[1], routes: map[string]string{}, lookup: map[string]int{}}
	hosts, err := ParseHosts(strings.NewReader(testHosts), "hosts")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		GuestIP:   guestIP,
		GatewayIP: gatewayIP,
		MAC:       guestMAC,
		Policy:    ProfilePolicy(mustProfile(t, testProfile)),
		Resolver:  countingResolver{hosts, r},
		Dial:      r.dial,
		Log: func(e Event) {
			r.mu.Lock()
			r.events = append(r.events, e)
			r.mu.Unlock()
		},
	}
	for _, o := range opts {
		o(&cfg)
	}
	host := os.NewFile(uintptr(fds[0]), "netstack-host")
	r.s, err = New(cfg, host)
	host.Close() // New keeps its own copy
	if err != nil {
		unix.Close(fds[1])
		t.Fatal(err)
	}
	r.guest = newGuestStack(t, fds[1], cfg.GuestIPv6.IsValid())
	t.Cleanup(func() {
		r.s.Close()
		r.guest.Close()
		r.guest.Wait()
		unix.Close(fds[1])
	})
	return r
}

type countingResolver struct {
	Resolver
	r *rig
}

func (c countingResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	c.r.mu.Lock()
	c.r.lookup[host]++
	c.r.mu.Unlock()
	return c.Resolver.LookupNetIP(ctx, network, host)
}

func (r *rig) route(network, fake, real string) {
	r.mu.Lock()
	r.routes[network+" "+fake] = real
	r.mu.Unlock()
}

func (r *rig) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	r.mu.Lock()
	r.dialed = append(r.dialed, network+" "+addr)
	target, ok := r.routes[network+" "+addr]
	r.mu.Unlock()
	if !ok {
		if !strings.HasPrefix(addr, "127.0.0.1:") {
			return nil, fmt.Errorf("rig: no route to %s %s", network, addr)
		}
		target = addr // host ports
	}
	var d net.Dialer
	return d.DialContext(ctx, network, target)
}

func (r *rig) eventsSnapshot() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Event(nil), r.events...)
}

// waitEvent waits for an event matching ok.
func (r *rig) waitEvent(what string, ok func(Event) bool) Event {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range r.eventsSnapshot() {
			if ok(e) {
				return e
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.t.Fatalf("no event: %s; have %v", what, r.eventsSnapshot())
	return Event{}
}

func newGuestStack(t testing.TB, fd int, v6 bool) *stack.Stack {
	t.Helper()
	nets := []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol}
	if v6 {
		nets = append(nets, ipv6.NewProtocol)
	}
	st := stack.New(stack.Options{
		NetworkProtocols:   nets,
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	sack := tcpip.TCPSACKEnabled(true)
	st.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	ep, err := fdbased.New(&fdbased.Options{
		FDs:                []int{fd},
		MTU:                1500,
		EthernetHeader:     true,
		Address:            tcpip.LinkAddress(guestMAC),
		PacketDispatchMode: fdbased.RecvMMsg,
	})
	if err != nil {
		t.Fatal(err)
	}
	gl := &guestLink{w: blockingWriter{fd: fd}}
	gl.Init(ep, gl)
	if err := st.CreateNIC(1, gl); err != nil {
		t.Fatal(err)
	}
	add := func(proto tcpip.NetworkProtocolNumber, a netip.Addr, bits int) {
		if err := st.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: proto,
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpAddr(a), PrefixLen: bits}}, stack.AddressProperties{}); err != nil {
			t.Fatal(err)
		}
	}
	add(ipv4.ProtocolNumber, guestIP, 24)
	routes := []tcpip.Route{
		{Destination: subnet("10.0.2.0/24"), NIC: 1},
		{Destination: header.IPv4EmptySubnet, Gateway: tcpAddr(gatewayIP), NIC: 1},
	}
	if v6 {
		add(ipv6.ProtocolNumber, guestIP6, 64)
		routes = append(routes,
			tcpip.Route{Destination: subnet("fd00:5c::/64"), NIC: 1},
			tcpip.Route{Destination: header.IPv6EmptySubnet, Gateway: tcpAddr(gatewayIP6), NIC: 1})
	}
	st.SetRouteTable(routes)
	return st
}

func (r *rig) dialTCP(ctx context.Context, dst string) (*gonet.TCPConn, error) {
	ap := netip.MustParseAddrPort(dst)
	proto := ipv4.ProtocolNumber
	if ap.Addr().Is6() {
		proto = ipv6.ProtocolNumber
	}
	return gonet.DialContextTCP(ctx, r.guest, tcpip.FullAddress{NIC: 1, Addr: tcpAddr(ap.Addr()), Port: ap.Port()}, proto)
}

func (r *rig) dialUDP(dst string) *gonet.UDPConn {
	r.t.Helper()
	ap := netip.MustParseAddrPort(dst)
	proto := ipv4.ProtocolNumber
	if ap.Addr().Is6() {
		proto = ipv6.ProtocolNumber
	}
	c, err := gonet.DialUDP(r.guest, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpAddr(ap.Addr()), Port: ap.Port()}, proto)
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// query asks the gateway's DNS over UDP (or TCP) from the guest.
func (r *rig) query(name string, qtype uint16, overTCP bool) (*dns.Msg, error) {
	var conn net.Conn
	var err error
	if overTCP {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err = r.dialTCP(ctx, "10.0.2.2:53")
	} else {
		conn = r.dialUDP("10.0.2.2:53")
	}
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	co := &dns.Conn{Conn: conn}
	co.SetDeadline(time.Now().Add(5 * time.Second))
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	return co.ReadMsg()
}

// tcpEcho serves an echo on host loopback and returns its address.
func tcpEcho(t testing.TB) string {
	t.Helper()
	return testutil.ServeTCP(t, func(c net.Conn) { io.Copy(c, c); c.Close() }).Addr().String()
}

func udpEcho(t testing.TB) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			n, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], a)
		}
	}()
	return pc.LocalAddr().String()
}

// isRefused reports a guest-side connection refused (the RST).
func isRefused(err error) bool {
	return err != nil && (errors.Is(err, unix.ECONNREFUSED) || strings.Contains(err.Error(), "connection was refused"))
}

func subnet(s string) tcpip.Subnet {
	p := netip.MustParsePrefix(s)
	return tcpip.AddressWithPrefix{Address: tcpAddr(p.Addr()), PrefixLen: p.Bits()}.Subnet()
}

func netipMust(s string) netip.Addr { return netip.MustParseAddr(s) }

// guestLink writes like QEMU does: when the socket is full it waits rather
// than dropping the frame.
type guestLink struct {
	nested.Endpoint
	w blockingWriter
}

func (g *guestLink) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	return g.w.write(g.Endpoint.Child(), pkts)
}
