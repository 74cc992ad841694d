package netstack

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// connectTarget parses an HTTP CONNECT request target strictly and
// returns the host (lower case; an IP address in its standard form), the
// port, and the target in the one form the gateway forwards (host:port,
// brackets around an IPv6 address). The proxy the guest dialled is sent
// exactly what was decided, so a target it might read differently from
// us is refused rather than passed on: userinfo (a@b:443, which one is
// the host?), a path, query or fragment (absolute-form or origin-form),
// percent-escapes and IPv6 zone ids, a trailing dot, a port with a sign
// or leading zeros, numeric shorthand such as 2130706433 or 127.1, and
// anything but letters, digits, '-', '_' and '.' in a name. why says
// what is wrong, for the refusal.
func connectTarget(raw string) (host string, port uint16, target, why string) {
	bad := func(what string) (string, uint16, string, string) {
		return "", 0, "", "HTTP CONNECT target " + strconv.Quote(trimTo(raw, 100)) + ": " + what + "; want host:port"
	}
	switch {
	case strings.Contains(raw, "@"):
		return bad("userinfo is not forwarded")
	case strings.ContainsAny(raw, "/?#\\"):
		return bad("a path or query (absolute- or origin-form) is not forwarded")
	case strings.Contains(raw, "%"):
		return bad("escapes and IPv6 zone ids are not forwarded")
	}
	h, ps, err := net.SplitHostPort(raw)
	if err != nil || h == "" {
		return bad("not host:port")
	}
	p, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || p == 0 || ps[0] == '0' || ps[0] == '+' {
		return bad("port " + strconv.Quote(ps) + " is not a number from 1 to 65535")
	}
	bracketed := strings.HasPrefix(raw, "[")
	if strings.Contains(h, ":") || bracketed {
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is6() || !bracketed || a.Zone() != "" {
			return bad("not an IPv6 address in brackets")
		}
		a = a.Unmap()
		return a.String(), uint16(p), net.JoinHostPort(a.String(), ps), ""
	}
	h = strings.ToLower(h)
	if i := strings.LastIndexByte(h, '.'); i+1 < len(h) && h[i+1] >= '0' && h[i+1] <= '9' {
		a, err := netip.ParseAddr(h)
		if err != nil || !a.Is4() {
			return bad("numeric host is not an IPv4 address in dotted form")
		}
		return a.String(), uint16(p), net.JoinHostPort(a.String(), ps), ""
	}
	if why := hostnameSyntax(h); why != "" {
		return bad(why)
	}
	return h, uint16(p), net.JoinHostPort(h, ps), ""
}

// hostnameSyntax says what is wrong with a lower-case host name, or "".
func hostnameSyntax(s string) string {
	if len(s) > 253 {
		return "host name longer than 253 characters"
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" {
			return "empty label in host name (or a trailing dot)"
		}
		if len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "bad label " + strconv.Quote(trimTo(label, 70))
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "host names use letters, digits, '-' and '_'"
			}
		}
	}
	return ""
}

func trimTo(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
