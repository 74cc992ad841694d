package netstack

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/fdbased"
	"gvisor.dev/gvisor/pkg/tcpip/link/nested"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// The link is gVisor's fdbased endpoint on the datagram socket: it reads
// with recvmmsg, and each datagram is one Ethernet frame, exactly what
// QEMU's `-netdev dgram` sends. filterEndpoint sits between it and the
// stack and drops, before any protocol sees them:
//
//   - IP packets whose source is not the guest's address (the guest cannot
//     spoof other sources into flows or logs; IPv6 link-local and
//     unspecified sources are let through for ICMPv6 only, for NDP);
//   - IPv6 when the sandbox has none;
//   - packets to loopback, multicast, broadcast and unspecified addresses;
//   - ICMP to anything but the gateway other than errors about packets the
//     guest received (promiscuous mode would otherwise answer pings for
//     every address on the Internet), and IP protocols other than TCP,
//     UDP and ICMP;
//   - UDP packets over the rate limit.
//
// Each drop but the last is a refusal record summarised per destination
// (drops.go); rate-limit drops are counted and reported per interval.
type filterEndpoint struct {
	nested.Endpoint
	s *Stack
	w blockingWriter

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func newLink(s *Stack, fd int) (*filterEndpoint, error) {
	child, err := fdbased.New(&fdbased.Options{
		FDs:                []int{fd},
		MTU:                uint32(s.cfg.MTU),
		EthernetHeader:     true,
		Address:            tcpip.LinkAddress(s.cfg.GatewayMAC),
		PacketDispatchMode: fdbased.RecvMMsg,
	})
	if err != nil {
		return nil, fmt.Errorf("link: %v", err)
	}
	e := &filterEndpoint{s: s, w: blockingWriter{fd: fd}, tokens: float64(s.cfg.UDPRate), last: time.Now()}
	e.Endpoint.Init(child, e)
	return e, nil
}

// DeliverNetworkPacket implements stack.NetworkDispatcher.
func (e *filterEndpoint) DeliverNetworkPacket(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) {
	if !e.admit(proto, pkt) {
		return
	}
	e.Endpoint.DeliverNetworkPacket(proto, pkt)
}

func (e *filterEndpoint) admit(proto tcpip.NetworkProtocolNumber, pkt *stack.PacketBuffer) bool {
	var (
		src, dst  netip.Addr
		transport uint8
		l4        []byte
		v6        bool
	)
	s := e.s
	switch proto {
	case header.IPv4ProtocolNumber:
		b, ok := pkt.Data().PullUp(header.IPv4MinimumSize)
		if !ok {
			return false
		}
		h := header.IPv4(b)
		hl := int(h.HeaderLength())
		if b, ok = pkt.Data().PullUp(min(hl+8, pkt.Data().Size())); !ok || hl < header.IPv4MinimumSize || len(b) < hl {
			return false
		}
		h = header.IPv4(b)
		src, dst, transport, l4 = netipAddr(h.SourceAddress()), netipAddr(h.DestinationAddress()), h.Protocol(), b[hl:]
	case header.IPv6ProtocolNumber:
		b, ok := pkt.Data().PullUp(min(header.IPv6MinimumSize+64, pkt.Data().Size()))
		if !ok || len(b) < header.IPv6MinimumSize {
			return false
		}
		h := header.IPv6(b)
		src, dst, transport, l4 = netipAddr(h.SourceAddress()), netipAddr(h.DestinationAddress()), h.NextHeader(), b[header.IPv6MinimumSize:]
		v6 = true
		transport, l4 = skipIPv6Options(transport, l4) // MLD reports carry a hop-by-hop option
		icmp := transport == uint8(header.ICMPv6ProtocolNumber) && len(l4) > 0
		if !s.v6() && icmp && l4[0] == uint8(header.ICMPv6NeighborSolicit) && !src.IsUnspecified() && len(l4) >= 24 {
			// Resolving a neighbour: the guest is trying to reach it (DAD,
			// from ::, is housekeeping).
			target, _ := netip.AddrFromSlice(l4[8:24])
			s.dropRecord("icmpv6", src, target, 0, RuleIPv6, "neighbour solicitation for "+target.String()+
				": the sandbox has no IPv6 (no address, no route), so IPv6 packets from the guest are dropped; use IPv4")
			return false
		}
		if icmp && (ndpOrMLD(l4[0]) || icmpError(true, l4[0])) {
			return s.v6() // link housekeeping: never recorded
		}
		if !s.v6() {
			s.dropRecord(protoName(transport), src, dst, l4Port(transport, l4), RuleIPv6,
				protoName(transport)+" to "+dst.String()+": the sandbox has no IPv6 (no address, no route), so IPv6 packets from the guest are dropped; use IPv4")
			return false
		}
		if icmp && (src.IsLinkLocalUnicast() || src.IsUnspecified()) {
			if l4[0] == uint8(header.ICMPv6EchoRequest) && !s.isGateway(dst) {
				s.dropPing(src, dst, true)
				return false
			}
			return true
		}
	default:
		return true // ARP
	}
	if transport == igmp && !v6 {
		return false // group membership reports: link housekeeping, like MLD; never recorded
	}
	if !s.isGuest(src) {
		s.dropRecord(protoName(transport), src, dst, l4Port(transport, l4), RuleSpoofed,
			"source address "+src.String()+" is not the guest's; packets with another source are dropped")
		return false
	}
	if cls := s.neverForwarded(dst); cls != "" {
		s.dropRecord(protoName(transport), src, dst, l4Port(transport, l4), RuleNotRouted,
			protoName(transport)+" to "+dst.String()+": a "+cls+" address, to which nothing from the guest is ever forwarded"+
				" (host services are reached as "+HostInternal+":PORT for the ports in network.host_ports)")
		return false
	}
	switch transport {
	case uint8(header.TCPProtocolNumber):
		if s.cfg.Activity != nil {
			s.cfg.Activity()
		}
	case uint8(header.UDPProtocolNumber):
		if !e.allowUDP() {
			s.udpDropped.Add(1)
			return false
		}
		if s.cfg.Activity != nil {
			s.cfg.Activity()
		}
	case uint8(header.ICMPv4ProtocolNumber), uint8(header.ICMPv6ProtocolNumber):
		if len(l4) == 0 {
			return false
		}
		if s.isGateway(dst) || icmpError(v6, l4[0]) {
			return true
		}
		s.dropPing(src, dst, v6)
		return false
	default:
		s.dropRecord(protoName(transport), src, dst, 0, RuleProto, "IP protocol "+strconv.Itoa(int(transport))+" to "+dst.String()+
			": the gateway forwards only TCP and UDP (and answers ICMP echo for itself)")
		return false
	}
	return true
}

func (s *Stack) dropPing(src, dst netip.Addr, v6 bool) {
	proto, gw := "icmp", s.cfg.GatewayIP.String()
	if v6 {
		proto = "icmpv6"
		if s.v6() {
			gw = s.cfg.GatewayIPv6.String()
		}
	}
	s.dropRecord(proto, src, dst, 0, RulePing, "ICMP to "+dst.String()+" is not forwarded; the gateway answers ping only for itself ("+gw+"); use TCP or UDP to test reachability")
}

// allowUDP is a token bucket holding one second of UDPRate.
func (e *filterEndpoint) allowUDP() bool {
	rate := float64(e.s.cfg.UDPRate)
	if rate < 0 {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	e.tokens = min(rate, e.tokens+now.Sub(e.last).Seconds()*rate)
	e.last = now
	if e.tokens < 1 {
		return false
	}
	e.tokens--
	return true
}

// reportDrops logs the UDP packets the rate limit dropped, at most once per
// RateLogInterval.
func (s *Stack) reportDrops() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.RateLogInterval)
	defer t.Stop()
	var reported int64
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		n := s.udpDropped.Load()
		if n == reported {
			continue
		}
		s.emit(Event{
			Kind: audit.KindNetRefused,
			Flow: Flow{Proto: ProtoUDP},
			Decision: policy.Decision{Rule: RuleUDPRate, Reason: fmt.Sprintf(
				"the guest sent UDP faster than %d packets/s; %d packets dropped", s.cfg.UDPRate, n-reported)},
			Dropped: n - reported,
		})
		reported = n
	}
}

// dupFD duplicates f's descriptor (close-on-exec) without changing f's
// blocking mode.
func dupFD(f *os.File) (int, error) {
	if f == nil {
		return -1, fmt.Errorf("no link file")
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return -1, err
	}
	var fd int
	var derr error
	if err := rc.Control(func(raw uintptr) {
		fd, derr = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return -1, err
	}
	if derr != nil {
		return -1, derr
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil || typ != unix.SOCK_DGRAM {
		unix.Close(fd)
		return -1, fmt.Errorf("%s is not a datagram socket (want one end of a SOCK_DGRAM socketpair)", f.Name())
	}
	return fd, nil
}

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

// A SOCK_DGRAM socketpair queues at most net.unix.max_dgram_qlen datagrams
// (10 by default) for its reader, so a burst from the stack to QEMU soon
// finds the socket full. fdbased would drop the rest of the burst (TCP then
// crawls through retransmits); blockingWriter waits for the socket to drain
// instead, which pushes back on the senders as a NIC queue would. It gives
// up on a batch after writeStall, so a wedged peer cannot hold the stack.
type blockingWriter struct {
	fd     int
	closed atomic.Bool
}

const writeStall = 2 * time.Second

func (w *blockingWriter) write(child stack.LinkEndpoint, pkts stack.PacketBufferList) (int, tcpip.Error) {
	all := pkts.AsSlice()
	sent := 0
	var stalled time.Duration
	for {
		var rest stack.PacketBufferList
		for _, p := range all[sent:] {
			rest.PushBack(p)
		}
		n, err := child.WritePackets(rest)
		sent += n
		if _, full := err.(*tcpip.ErrWouldBlock); !full || sent == len(all) {
			return sent, err
		}
		if n > 0 {
			stalled = 0
		}
		if w.closed.Load() || stalled >= writeStall {
			return sent, err
		}
		t0 := time.Now()
		fds := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLOUT}}
		_, _ = unix.Poll(fds, 50)
		stalled += time.Since(t0)
	}
}

// WritePackets implements stack.LinkEndpoint.
func (e *filterEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	if e.s.cfg.Activity != nil {
		e.s.cfg.Activity()
	}
	return e.w.write(e.Endpoint.Child(), pkts)
}
