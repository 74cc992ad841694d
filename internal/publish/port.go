package publish

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Port is a guest TCP port published on the host (-p): the supervisor
// listens on HostIP:HostPort and carries each connection it accepts to
// the guest's GuestPort through the sandbox's own network gateway, so the
// guest is never put on the host's network.
type Port struct {
	// HostIP is the address the supervisor binds: 127.0.0.1 unless the
	// user named another one and said that it may be reached from beyond
	// this host (External).
	HostIP netip.Addr `json:"host_ip"`
	// HostPort 0 asks for a free port at each start; the bound one is
	// what the supervisor reports (Binding).
	HostPort  uint16 `json:"host_port"`
	GuestPort uint16 `json:"guest_port"`
	// External: HostIP is not a loopback address, allowed explicitly
	// (--publish-external) when the port was published.
	External bool `json:"external,omitempty"`
}

// DefaultPortIP is where a published port listens unless told otherwise:
// only this host can reach it.
var DefaultPortIP = netip.MustParseAddr("127.0.0.1")

// String is the port in -p notation, HOSTIP:HOSTPORT:GUESTPORT/tcp.
func (p Port) String() string {
	return fmt.Sprintf("%s:%d/tcp", p.Host(p.HostPort), p.GuestPort)
}

// Host is HostIP:port, bracketed for IPv6.
func (p Port) Host(port uint16) string {
	return netip.AddrPortFrom(p.HostIP, port).String()
}

// Named is how a message names the port a user gave: HOSTIP:HOSTPORT,
// or the whole -p notation for one published as 0.
func (p Port) Named() string {
	if p.HostPort == 0 {
		return p.String()
	}
	return p.Host(p.HostPort)
}

// Same reports whether p and q publish the same host address and port
// (a HostPort 0 is never the same as another).
func (p Port) Same(q Port) bool {
	return p.HostPort != 0 && p.HostIP == q.HostIP && p.HostPort == q.HostPort
}

// ParsePort reads Docker's -p notation, [HOSTIP:]HOSTPORT:GUESTPORT[/tcp]
// (an IPv6 HOSTIP in brackets). HOSTPORT 0 picks a free port. A HOSTIP
// that is not a loopback address is refused unless external is set (the
// user's --publish-external): a published port reaches into the sandbox,
// so another machine reaching it must be asked for by name.
func ParsePort(s string, external bool) (Port, error) {
	bad := func(why string) (Port, error) {
		return Port{}, fmt.Errorf("-p %s: %s: %w", s, why, errdefs.ErrInvalid)
	}
	spec, proto, hasProto := strings.Cut(s, "/")
	if hasProto && proto != "tcp" {
		return bad("only tcp ports can be published")
	}
	p := Port{HostIP: DefaultPortIP}
	i := strings.LastIndexByte(spec, ':')
	if i < 0 {
		return bad("want [HOSTIP:]HOSTPORT:GUESTPORT, e.g. -p 8080:80 (a lone GUESTPORT is not published: name the host port, or 0 for a free one)")
	}
	guest, rest := spec[i+1:], spec[:i]
	host := rest
	if j := strings.LastIndexByte(rest, ':'); j >= 0 {
		ip := strings.TrimSuffix(strings.TrimPrefix(rest[:j], "["), "]")
		a, err := netip.ParseAddr(ip)
		if err != nil || a.Zone() != "" {
			return bad(fmt.Sprintf("host address %q is not an IP address", rest[:j]))
		}
		p.HostIP, host = a.Unmap(), rest[j+1:]
	}
	hp, err := strconv.ParseUint(host, 10, 16)
	if err != nil {
		return bad(fmt.Sprintf("host port %q: want 0 (a free port) to 65535", host))
	}
	gp, err := strconv.ParseUint(guest, 10, 16)
	if err != nil || gp == 0 {
		return bad(fmt.Sprintf("guest port %q: want 1 to 65535", guest))
	}
	p.HostPort, p.GuestPort = uint16(hp), uint16(gp)
	if !p.HostIP.IsLoopback() {
		if !external {
			return bad(fmt.Sprintf("%s is reachable from other machines; add --publish-external to publish there, or leave out the address for 127.0.0.1", p.HostIP))
		}
		p.External = true
	}
	return p, nil
}

// ParsePorts parses each of specs (ParsePort) and refuses two that bind
// the same host address and port.
func ParsePorts(specs []string, external bool) ([]Port, error) {
	var out []Port
	for _, s := range specs {
		p, err := ParsePort(s, external)
		if err != nil {
			return nil, err
		}
		for _, q := range out {
			if p.Same(q) {
				return nil, fmt.Errorf("-p %s: host port %s is published twice: %w", s, p.Host(p.HostPort), errdefs.ErrInvalid)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// Binding is a published port as its supervisor serves it: HostPort is
// the port bound (the one picked, for a Port asking for 0).
type Binding struct {
	Port
	Bound uint16 `json:"bound"`
}

// String is "HOSTIP:BOUND -> GUESTPORT/tcp", as `docker port` prints.
func (b Binding) String() string {
	return fmt.Sprintf("%d/tcp -> %s", b.GuestPort, b.Host(b.Bound))
}

// ParseSelector reads the port `smx agent port rm` names: -p notation, or
// just [HOSTIP:]HOSTPORT (the port bound, for one published as 0). Any
// host address may be named: nothing is bound by it.
func ParseSelector(s string) (Port, error) {
	if p, err := ParsePort(s, true); err == nil {
		return p, nil
	}
	p := Port{HostIP: DefaultPortIP}
	host := s
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s[:i], "["), "]"))
		if err != nil {
			return Port{}, fmt.Errorf("port %s: want [HOSTIP:]HOSTPORT[:GUESTPORT], e.g. 8080: %w", s, errdefs.ErrInvalid)
		}
		p.HostIP, host = a.Unmap(), s[i+1:]
	}
	n, err := strconv.ParseUint(host, 10, 16)
	if err != nil || n == 0 {
		return Port{}, fmt.Errorf("port %s: want [HOSTIP:]HOSTPORT[:GUESTPORT], e.g. 8080: %w", s, errdefs.ErrInvalid)
	}
	p.HostPort = uint16(n)
	return p, nil
}

// Selects reports whether selector sel (ParseSelector) names published
// port p, bound on host port bound (0 when not bound now): by the host
// port bound or asked for, or, for a port published as 0, as it was
// published (0:GUESTPORT).
func Selects(sel Port, p Port, bound uint16) bool {
	if p.HostIP != sel.HostIP || sel.GuestPort != 0 && sel.GuestPort != p.GuestPort {
		return false
	}
	if sel.HostPort == 0 {
		return p.HostPort == 0 && sel.GuestPort != 0
	}
	return sel.HostPort == bound || sel.HostPort == p.HostPort
}
