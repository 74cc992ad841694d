package netstack

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/smx-dev/smx/internal/audit"
)

// rawFrame is an Ethernet frame from the guest's MAC to the gateway's
// carrying an IPv4 packet (src → dst, protocol proto) with payload.
func rawFrame(src, dst netip.Addr, proto uint8, payload []byte) []byte {
	eth := make([]byte, 14)
	copy(eth[0:6], []byte{0x52, 0x55, 0x0a, 0x00, 0x02, 0x02})
	copy(eth[6:12], guestMAC)
	binary.BigEndian.PutUint16(eth[12:], uint16(header.IPv4ProtocolNumber))
	ip := header.IPv4(make([]byte, header.IPv4MinimumSize))
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(header.IPv4MinimumSize + len(payload)), TTL: 64,
		Protocol: proto, SrcAddr: tcpAddr(src), DstAddr: tcpAddr(dst)})
	ip.SetChecksum(^ip.CalculateChecksum())
	return append(append(eth, ip...), payload...)
}

// rawFrame6 is rawFrame for IPv6.
func rawFrame6(src, dst netip.Addr, next uint8, payload []byte) []byte {
	eth := make([]byte, 14)
	copy(eth[0:6], []byte{0x52, 0x55, 0x0a, 0x00, 0x02, 0x02})
	copy(eth[6:12], guestMAC)
	binary.BigEndian.PutUint16(eth[12:], uint16(header.IPv6ProtocolNumber))
	ip := header.IPv6(make([]byte, header.IPv6MinimumSize))
	ip.Encode(&header.IPv6Fields{PayloadLength: uint16(len(payload)), TransportProtocol: tcpip.TransportProtocolNumber(next),
		HopLimit: 64, SrcAddr: tcpAddr(src), DstAddr: tcpAddr(dst)})
	return append(append(eth, ip...), payload...)
}

// tcpSYN is a TCP header with SYN set, to port.
func tcpSYN(port uint16) []byte {
	syn := make([]byte, 20)
	binary.BigEndian.PutUint16(syn[0:], 40000)
	binary.BigEndian.PutUint16(syn[2:], port)
	syn[12], syn[13] = 5<<4, 0x02
	return syn
}

// Every guest packet the link filter drops is recorded, summarised per
// destination: one record per second with a count.
func TestDropsAreRecorded(t *testing.T) {
	r := newRig(t)
	echo := []byte{8, 0, 0, 0, 0, 1, 0, 1} // ICMP echo request
	udp := []byte{0x30, 0x39, 0x14, 0xe9, 0, 8, 0, 0}
	syn := tcpSYN(80)
	other := netipMust("203.0.113.5")
	send := func(f []byte) {
		if _, err := unix.Write(r.gfd, f); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 3; i++ {
		send(rawFrame(guestIP, other, uint8(header.ICMPv4ProtocolNumber), echo))
	}
	send(rawFrame(guestIP, other, 47, []byte{0, 0, 0x08, 0})) // GRE
	send(rawFrame(netipMust("10.0.2.99"), other, uint8(header.UDPProtocolNumber), udp))
	send(rawFrame(guestIP, netipMust("224.0.0.251"), uint8(header.UDPProtocolNumber), udp))
	send(rawFrame(guestIP, netipMust("10.0.2.255"), uint8(header.UDPProtocolNumber), udp))
	send(rawFrame(guestIP, netipMust("127.0.0.1"), uint8(header.TCPProtocolNumber), syn))
	// An ICMP error about a packet the guest received is not the guest
	// reaching out, and an IGMP report is link housekeeping: not recorded.
	send(rawFrame(guestIP, other, uint8(header.ICMPv4ProtocolNumber), []byte{3, 3, 0, 0, 0, 0, 0, 0}))
	send(rawFrame(guestIP, netipMust("224.0.0.22"), igmp, []byte{0x22, 0, 0, 0, 0, 0, 0, 0}))

	for _, c := range []struct{ rule, proto, dst, reason string }{
		{RulePing, "icmp", "203.0.113.5", "answers ping only for itself"},
		{RuleProto, "ip-47", "203.0.113.5", "IP protocol 47"},
		{RuleSpoofed, "udp", "203.0.113.5:5353", "10.0.2.99 is not the guest's"},
		{RuleNotRouted, "udp", "224.0.0.251:5353", "a multicast address"},
		{RuleNotRouted, "udp", "10.0.2.255:5353", "a broadcast address"},
		{RuleNotRouted, "tcp", "127.0.0.1:80", "a loopback address"},
	} {
		e := r.waitEvent(c.rule+" "+c.dst, func(e Event) bool {
			return e.Kind == audit.KindNetRefused && e.Decision.Rule == c.rule && e.Fields()["dst"] == c.dst
		})
		if e.Flow.Proto != c.proto || !strings.Contains(e.Decision.Reason, c.reason) || e.Count < 1 {
			t.Errorf("%s: %+v", c.rule, e)
		}
	}
	// The three pings are one record (or two, if a window ended between
	// them), counting all three.
	time.Sleep(2 * summaryInterval)
	n, count := 0, int64(0)
	for _, e := range r.eventsSnapshot() {
		if e.Decision.Rule == RulePing {
			n++
			count += e.Count
		}
		if e.Kind == audit.KindNetRefused && e.Flow.Proto == "icmp" && e.Decision.Rule != RulePing {
			t.Errorf("ICMP error recorded: %+v", e)
		}
		if e.Flow.Proto == "ip-2" {
			t.Errorf("IGMP recorded: %+v", e)
		}
	}
	if count != 3 || n > 2 {
		t.Errorf("3 pings made %d records counting %d", n, count)
	}
}

// A refused lookup (A, AAAA, retries) is one record per name per second,
// whose reason speaks of the name, not of a port.
func TestDNSRefusalsSummarised(t *testing.T) {
	r := newRig(t)
	for _, q := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeA} {
		if m, err := r.query("unlisted.test", q, false); err != nil || m.Rcode != dns.RcodeNameError {
			t.Fatalf("query: %v, %v", m, err)
		}
	}
	time.Sleep(2 * summaryInterval)
	n, count := 0, int64(0)
	for _, e := range r.eventsSnapshot() {
		if e.Flow.Proto == ProtoDNS && e.Flow.Host == "unlisted.test" {
			n++
			count += e.Count
			if !strings.Contains(e.Decision.Reason, "unlisted.test on any port") || strings.Contains(e.Decision.Reason, "port 1") {
				t.Errorf("reason %q", e.Decision.Reason)
			}
		}
	}
	if count != 3 || n > 2 {
		t.Errorf("3 refused queries made %d records counting %d", n, count)
	}
}

// A refused UDP session is recorded once per second with the number of
// datagrams dropped, not once per retry window.
func TestUDPRefusalsCounted(t *testing.T) {
	r := newRig(t)
	u := r.dialUDP("203.0.113.77:9")
	defer u.Close()
	for range 4 {
		u.Write([]byte("x"))
	}
	time.Sleep(2 * summaryInterval)
	n, count := 0, int64(0)
	for _, e := range r.eventsSnapshot() {
		if e.Kind == audit.KindNetRefused && e.Flow.Dst.String() == "203.0.113.77:9" {
			n++
			count += e.Count
			if e.Decision.Rule != "default deny" {
				t.Errorf("refusal %+v", e)
			}
		}
	}
	if count != 4 || n > 2 {
		t.Errorf("4 refused datagrams made %d records counting %d", n, count)
	}
}
