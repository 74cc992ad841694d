package netstack

import (
	"context"
	"errors"
	"fmt"
	"github.com/smx-dev/smx/internal/audit"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
)

// The DNS server listens on the gateway address, UDP and TCP port 53. It
// answers A and AAAA queries for names the policy lets resolve, resolving
// them with Config.Resolver; every other name gets NXDOMAIN and a refusal
// event, and is never sent to the host's resolver. Other query types of an
// allowed name get an empty answer (so TXT, MX, SRV, ... cannot carry data
// back). host.smx.internal is answered with the gateway address when
// HostPorts is not empty.

func (s *Stack) startDNS() error {
	h := dns.HandlerFunc(s.serveDNS)
	type bind struct {
		addr  netip.Addr
		proto tcpip.NetworkProtocolNumber
	}
	binds := []bind{{s.cfg.GatewayIP, ipv4.ProtocolNumber}}
	if s.v6() {
		binds = append(binds, bind{s.cfg.GatewayIPv6, ipv6.ProtocolNumber})
	}
	for _, b := range binds {
		fa := tcpip.FullAddress{NIC: nicID, Addr: tcpAddr(b.addr), Port: 53}
		pc, err := gonet.DialUDP(s.st, &fa, nil, b.proto)
		if err != nil {
			return fmt.Errorf("dns: udp: %v", err)
		}
		ln, err := gonet.ListenTCP(s.st, fa, b.proto)
		if err != nil {
			pc.Close()
			return fmt.Errorf("dns: tcp: %v", err)
		}
		for _, srv := range []*dns.Server{
			{PacketConn: pc, Handler: h},
			{Listener: ln, Handler: h, ReadTimeout: 5 * time.Second, IdleTimeout: func() time.Duration { return 10 * time.Second }},
		} {
			started := make(chan struct{})
			srv.NotifyStartedFunc = func() { close(started) }
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				_ = srv.ActivateAndServe()
			}()
			<-started
			s.dns = append(s.dns, srv)
		}
	}
	return nil
}

func (s *Stack) serveDNS(w dns.ResponseWriter, req *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true
	defer func() { _ = w.WriteMsg(m) }()
	if req.Opcode != dns.OpcodeQuery || len(req.Question) != 1 {
		m.Rcode = dns.RcodeNotImplemented
		return
	}
	q := req.Question[0]
	name := canonicalName(q.Name)
	if q.Qclass != dns.ClassINET {
		m.Rcode = dns.RcodeNotImplemented
		return
	}
	if q.Qtype == dns.TypePTR {
		// Reverse lookups are common and harmless to refuse; not logged.
		m.Rcode = dns.RcodeNameError
		return
	}
	if name == HostInternal {
		if len(s.cfg.HostPorts) == 0 {
			m.Rcode = dns.RcodeNameError
			return
		}
		var ips []netip.Addr
		switch {
		case q.Qtype == dns.TypeA:
			ips = []netip.Addr{s.cfg.GatewayIP}
		case q.Qtype == dns.TypeAAAA && s.v6():
			ips = []netip.Addr{s.cfg.GatewayIPv6}
		}
		m.Answer = s.records(q.Name, ips)
		return
	}
	f := Flow{Proto: ProtoDNS, Host: name}
	d := s.decide(f)
	// A name an ask rule (or network.mode ask) covers is resolved: the
	// question is put when a flow to it opens, where its first bytes name
	// the host (TLS server name, HTTP Host) the user is asked about.
	if !d.Allow && !d.Ask {
		// A lookup asks for A and AAAA and retries: one record per name
		// per second, with a count.
		s.emitSummarized("dns|"+name, Event{Kind: audit.KindNetRefused, Flow: f, Decision: d})
		m.Rcode = dns.RcodeNameError
		return
	}
	var network string
	switch {
	case q.Qtype == dns.TypeA:
		network = "ip4"
	case q.Qtype == dns.TypeAAAA && s.v6():
		network = "ip6"
	default:
		return // NOERROR, no records
	}
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
	defer cancel()
	ips, err := s.cfg.Resolver.LookupNetIP(ctx, network, name)
	if err != nil {
		if network == "ip4" {
			// An allowed name that does not resolve (a typo in a profile,
			// a dead domain) is on the record, with the rule that allowed it.
			s.emit(Event{Kind: audit.KindNetUnresolved, Flow: f, Decision: d, Err: err.Error()})
		}
		var de *net.DNSError
		switch {
		case errors.As(err, &de) && de.IsNotFound && network == "ip4":
			m.Rcode = dns.RcodeNameError
		case errors.As(err, &de) && de.IsNotFound:
			// No IPv6 address; the name may still have IPv4 ones.
		default:
			m.Rcode = dns.RcodeServerFailure
		}
		return
	}
	for i, ip := range ips {
		ips[i] = ip.WithZone("").Unmap()
	}
	ips = slices.DeleteFunc(ips, func(ip netip.Addr) bool { return network == "ip4" != ip.Is4() })
	s.names.add(name, ips, time.Now().Add(s.cfg.DNSTTL+s.cfg.DNSGrace))
	m.Answer = s.records(q.Name, ips)
}

func (s *Stack) records(qname string, ips []netip.Addr) []dns.RR {
	ttl := uint32(s.cfg.DNSTTL / time.Second)
	var rrs []dns.RR
	for _, ip := range ips {
		if ip.Is4() {
			rrs = append(rrs, &dns.A{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: ttl}, A: ip.AsSlice()})
		} else {
			rrs = append(rrs, &dns.AAAA{Hdr: dns.RR_Header{Name: qname, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: ttl}, AAAA: ip.AsSlice()})
		}
	}
	return rrs
}

// nameMap remembers which names our DNS answered with which addresses,
// until the answer's TTL plus grace has passed, so that a connection to
// the address is judged with the name. It is bounded: when full, expired
// entries are swept, and if it is still full new answers are not
// remembered (their flows are then judged by IP rules only, which fails
// closed in a default-deny profile).
type nameMap struct {
	mu sync.Mutex
	m  map[netip.Addr][]nameEntry // newest last
}

type nameEntry struct {
	name string
	exp  time.Time
}

const (
	maxMappedAddrs = 1 << 16
	maxNamesPerIP  = 16
)

func newNameMap() *nameMap { return &nameMap{m: map[netip.Addr][]nameEntry{}} }

func (nm *nameMap) add(name string, ips []netip.Addr, exp time.Time) {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	now := time.Now()
	for _, ip := range ips {
		es, ok := nm.m[ip]
		if !ok && len(nm.m) >= maxMappedAddrs {
			nm.sweep(now)
			if len(nm.m) >= maxMappedAddrs {
				return
			}
		}
		es = slices.DeleteFunc(es, func(e nameEntry) bool { return e.name == name || !now.Before(e.exp) })
		if len(es) >= maxNamesPerIP {
			es = es[1:]
		}
		nm.m[ip] = append(es, nameEntry{name, exp})
	}
}

func (nm *nameMap) sweep(now time.Time) {
	for ip, es := range nm.m {
		es = slices.DeleteFunc(es, func(e nameEntry) bool { return !now.Before(e.exp) })
		if len(es) == 0 {
			delete(nm.m, ip)
		} else {
			nm.m[ip] = es
		}
	}
}

// lookup returns the live names answered with ip, newest first.
func (nm *nameMap) lookup(ip netip.Addr, now time.Time) []string {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	es := nm.m[ip.WithZone("").Unmap()]
	var out []string
	for i := len(es) - 1; i >= 0; i-- {
		if now.Before(es[i].exp) {
			out = append(out, es[i].name)
		}
	}
	return out
}
