package netstack

import (
	"net/netip"
	"strconv"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// Every packet the guest sends that the gateway drops is on the record, so
// a user who wonders why something fails finds the answer in
// `smx agent logs --refusals`. Packets do not open flows, so they are not
// decided one by one: the link filter drops them and records a refusal
// summarised per destination (and DNS refusals per name): at most one
// record per key per second, carrying how many packets it stands for.
//
// Not recorded: link housekeeping the guest kernel does on its own (ARP,
// IGMP, and IPv6 neighbour discovery of its own address, router
// solicitations and MLD), and ICMP errors the guest sends back about
// packets it received (the stack uses those for the flows they concern).

// Refusals of packets dropped by the link filter.
const (
	RuleIPv6      = "netstack: ipv6 closed"                 // IPv6 when the sandbox has none
	RulePing      = "netstack: icmp not forwarded"          // ICMP to anything but the gateway
	RuleProto     = "netstack: protocol not forwarded"      // IP protocols other than TCP, UDP, ICMP
	RuleSpoofed   = "netstack: spoofed source"              // a source address that is not the guest's
	RuleNotRouted = "netstack: destination never forwarded" // loopback, multicast, broadcast, unspecified
)

// igmp is IPv4's group membership protocol.
const igmp = 2

// summaryInterval is the window one summarised record covers.
const summaryInterval = time.Second

// maxSummaryKeys bounds the distinct keys held per window; beyond it,
// packets are counted under one overflow key.
const maxSummaryKeys = 4096

type pendingEvent struct {
	e Event
	n int64
}

type summaries struct {
	mu sync.Mutex
	m  map[string]*pendingEvent
}

// emitSummarized queues e to be logged at the end of the current window,
// once per key, with how many times it happened.
func (s *Stack) emitSummarized(key string, e Event) {
	if s.cfg.Log == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	s.sums.mu.Lock()
	defer s.sums.mu.Unlock()
	if s.sums.m == nil {
		s.sums.m = map[string]*pendingEvent{}
	}
	p := s.sums.m[key]
	if p == nil {
		if len(s.sums.m) >= maxSummaryKeys {
			key = "overflow"
			e = Event{Kind: audit.KindNetRefused, Time: e.Time, Decision: policy.Decision{Rule: e.Decision.Rule,
				Reason: "more than " + strconv.Itoa(maxSummaryKeys) + " distinct destinations in one second; counted together"}}
			if p = s.sums.m[key]; p != nil {
				p.n++
				return
			}
		}
		s.sums.m[key] = &pendingEvent{e: e, n: 1}
		return
	}
	p.n++
}

// flushSummaries logs what the window collected.
func (s *Stack) flushSummaries() {
	s.sums.mu.Lock()
	m := s.sums.m
	s.sums.m = nil
	s.sums.mu.Unlock()
	for _, p := range m {
		p.e.Count = p.n
		s.emit(p.e)
	}
}

func (s *Stack) summarize() {
	defer s.wg.Done()
	t := time.NewTicker(summaryInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return // Close flushes
		case <-t.C:
			s.flushSummaries()
		}
	}
}

// dropRecord records a guest packet the link filter dropped.
func (s *Stack) dropRecord(proto string, src, dst netip.Addr, port uint16, rule, reason string) {
	f := Flow{Proto: proto, Src: netip.AddrPortFrom(src, 0), Dst: netip.AddrPortFrom(dst, port)}
	s.emitSummarized("drop|"+rule+"|"+proto+"|"+f.Dst.String(), Event{Kind: audit.KindNetRefused, Flow: f,
		Decision: policy.Decision{Rule: rule, Reason: reason}})
}

// neverForwarded names the class of a destination no packet from the guest
// is ever forwarded to, or "".
func (s *Stack) neverForwarded(dst netip.Addr) string {
	switch {
	case dst.IsLoopback():
		return "loopback"
	case dst.IsMulticast():
		return "multicast"
	case dst.IsUnspecified() || dst.Is4() && dst.As4()[0] == 0:
		return "unspecified"
	case dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "broadcast"
	}
	if dst.Is4() {
		// The subnet's broadcast address.
		p := netip.PrefixFrom(s.cfg.GatewayIP, s.cfg.PrefixLen).Masked()
		b := p.Addr().As4()
		for i := s.cfg.PrefixLen; i < 32; i++ {
			b[i/8] |= 1 << (7 - i%8)
		}
		if dst == netip.AddrFrom4(b) {
			return "broadcast"
		}
	}
	return ""
}

// protoName names an IP protocol number for the log.
func protoName(n uint8) string {
	switch n {
	case uint8(header.TCPProtocolNumber):
		return ProtoTCP
	case uint8(header.UDPProtocolNumber):
		return ProtoUDP
	case uint8(header.ICMPv4ProtocolNumber):
		return "icmp"
	case uint8(header.ICMPv6ProtocolNumber):
		return "icmpv6"
	}
	return "ip-" + strconv.Itoa(int(n))
}

// l4Port returns the destination port of a TCP or UDP header at the start
// of l4, or 0.
func l4Port(transport uint8, l4 []byte) uint16 {
	if (transport == uint8(header.TCPProtocolNumber) || transport == uint8(header.UDPProtocolNumber)) && len(l4) >= 4 {
		return uint16(l4[2])<<8 | uint16(l4[3])
	}
	return 0
}

// icmpError reports ICMP messages that report on a packet the guest
// received (destination unreachable, time exceeded, parameter problem,
// packet too big): the guest is not reaching out with them.
func icmpError(v6 bool, typ uint8) bool {
	if v6 {
		return typ >= 1 && typ <= 4
	}
	return typ == 3 || typ == 11 || typ == 12
}

// ndpOrMLD reports ICMPv6 link housekeeping: router and neighbour
// solicitations and advertisements, redirects, MLD queries and reports.
func ndpOrMLD(typ uint8) bool {
	return typ >= 130 && typ <= 137 || typ == 143
}

// skipIPv6Options steps over hop-by-hop and destination option headers at
// the start of l4 (as far as l4 reaches) and returns the next protocol.
func skipIPv6Options(next uint8, l4 []byte) (uint8, []byte) {
	for i := 0; i < 2 && (next == 0 || next == 60) && len(l4) >= 8; i++ {
		n := 8 + int(l4[1])*8
		if len(l4) < n {
			return next, l4
		}
		next, l4 = l4[0], l4[n:]
	}
	return next, l4
}
