package policy

import (
	"errors"
	"net/netip"
	"strings"
)

// hostInternal is the name under which the guest reaches host loopback
// services listed in network.host_ports.
const hostInternal = "host.smx.internal"

// closedRange is an address range no profile can open.
type closedRange struct {
	prefix netip.Prefix
	what   string
	rule   string // Decision.Rule, built once
}

func mkClosed(cidr, what string) closedRange {
	p := netip.MustParsePrefix(cidr)
	return closedRange{prefix: p, what: what, rule: "builtin: " + what + " " + cidr + " is always closed"}
}

// alwaysClosed is checked first, against the request's IP after Unmap (and
// after NAT64 translation). Metadata comes before link-local so that the
// reason names it.
var alwaysClosed = []closedRange{
	mkClosed("169.254.169.254/32", "cloud metadata"),
	mkClosed("fd00:ec2::254/128", "cloud metadata"),
	mkClosed("169.254.0.0/16", "link-local"),
	mkClosed("fe80::/10", "link-local"),
	mkClosed("127.0.0.0/8", "host loopback"),
	mkClosed("::1/128", "host loopback"),
	mkClosed("0.0.0.0/8", "unspecified (this host)"),
	mkClosed("::/96", "unspecified or IPv4-compatible IPv6"),
	mkClosed("224.0.0.0/4", "multicast"),
	mkClosed("ff00::/8", "multicast"),
	mkClosed("255.255.255.255/32", "broadcast"),
}

// privateRanges are closed unless an allow rule's CIDR lies inside one.
var privateRanges = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("fc00::/7"),
}

const rulePrivate = "builtin: private range closed unless a cidr rule names it"

var nat64 = netip.MustParsePrefix("64:ff9b::/96")

// canonicalIP drops the zone, unmaps IPv4-mapped IPv6 and translates the
// NAT64 well-known prefix, so that no spelling of an address escapes the
// range checks.
func canonicalIP(ip netip.Addr) netip.Addr {
	if !ip.IsValid() {
		return ip
	}
	ip = ip.WithZone("").Unmap()
	if nat64.Contains(ip) {
		b := ip.As16()
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	return ip
}

func closedIP(ip netip.Addr) *closedRange {
	for i := range alwaysClosed {
		if alwaysClosed[i].prefix.Contains(ip) {
			return &alwaysClosed[i]
		}
	}
	return nil
}

func isPrivate(ip netip.Addr) bool {
	for _, p := range privateRanges {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// closedOverlap names the always-closed range pfx overlaps; "" if none. A
// /0 ("everything") is not taken to name the closed ranges.
func closedOverlap(pfx netip.Prefix) string {
	if pfx.Bits() == 0 {
		return ""
	}
	for _, c := range alwaysClosed {
		if pfx.Overlaps(c.prefix) {
			return c.what + " " + c.prefix.String()
		}
	}
	return ""
}

// insidePrivate reports whether pfx lies entirely inside a private range,
// which is what "a cidr rule names it" means.
func insidePrivate(pfx netip.Prefix) bool {
	for _, p := range privateRanges {
		if p.Bits() <= pfx.Bits() && p.Contains(pfx.Addr()) {
			return true
		}
	}
	return false
}

// closedName reports host names that always mean the host itself or cloud
// metadata, whatever the resolver says.
func closedName(host string) bool {
	return host == "localhost" || strings.HasSuffix(host, ".localhost") ||
		host == "metadata.google.internal"
}

// checkHostname reports what is wrong with a lower-case DNS name, or "".
// A name whose last label starts with a digit is refused: resolvers read
// "2130706433", "0177.1" or "0x7f.1" as IP addresses.
func checkHostname(s string) string {
	if s == "" {
		return "empty host name"
	}
	if len(s) > 253 {
		return "host name longer than 253 characters"
	}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			c := s[i]
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			case c >= 0x80:
				return "not ASCII; write the punycode (xn--) form"
			default:
				return "host names use letters, digits, '-' and '_'"
			}
			continue
		}
		label := s[start:i]
		if len(label) == 0 {
			return "empty label in host name"
		}
		if len(label) > 63 {
			return "label longer than 63 characters"
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return "a label cannot start or end with '-'"
		}
		if i == len(s) && label[0] >= '0' && label[0] <= '9' {
			return "looks like a number; write an IP address in standard dotted or colon form"
		}
		start = i + 1
	}
	return ""
}

// splitHost normalises a request's host: one trailing dot dropped, lower
// case. An IP literal comes back as ip instead of host. bad says why the
// host is unusable.
func splitHost(s string) (host string, ip netip.Addr, bad string) {
	if s == "" {
		return "", ip, ""
	}
	s = strings.TrimSuffix(s, ".")
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			s = strings.ToLower(s)
			break
		}
	}
	if strings.IndexByte(s, ':') >= 0 || lastLabelNumeric(s) {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return "", ip, "not a host name or an IP address in standard form"
		}
		return "", a, ""
	}
	if msg := checkHostname(s); msg != "" {
		return "", ip, msg
	}
	return s, ip, ""
}

func lastLabelNumeric(s string) bool {
	i := strings.LastIndexByte(s, '.')
	return i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9'
}

var errTooBroad = errors.New("too broad; a wildcard needs at least two labels after it, as in *.example.com")

// normDomainPattern validates and normalises a domain rule: lower case,
// trailing dot dropped, `*.` only as the whole first label.
func normDomainPattern(s string) (string, error) {
	d := strings.TrimSuffix(strings.ToLower(s), ".")
	rest, wild := strings.CutPrefix(d, "*.")
	if d == "*" || d == "" {
		return "", errTooBroad
	}
	if strings.ContainsAny(rest, "*?") {
		return "", errors.New("a wildcard is only allowed as the whole first label, as in *.example.com")
	}
	if _, err := netip.ParseAddr(rest); err == nil {
		return "", errors.New("is an IP address; write a cidr rule")
	}
	if msg := checkHostname(rest); msg != "" {
		return "", errors.New(msg)
	}
	if wild && !strings.Contains(rest, ".") {
		return "", errTooBroad
	}
	return d, nil
}

// matchDomain matches a normalised host against a normalised pattern:
// "*.example.com" matches "a.example.com" and "a.b.example.com" but not
// "example.com" or "evilexample.com".
func matchDomain(pattern, host string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return len(host) > len(suffix) && strings.HasSuffix(host, suffix)
	}
	return pattern == host
}
