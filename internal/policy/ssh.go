package policy

import (
	"net/netip"
	"strconv"
	"strings"
)

// DecideSSH decides r (KindSSH) exactly as Decide does and, when r is
// allowed, also returns the allow rule that allowed it: its options (sftp,
// forward, env, host_key) say what the session may do besides exec and
// shell.
func (p *Profile) DecideSSH(r Request) (Decision, SSHRule) {
	d, i := p.decideSSHRule(r)
	if !d.Allow && !d.Ask || i < 0 || i >= len(p.SSH.Allow) {
		return d, SSHRule{}
	}
	return d, p.SSH.Allow[i]
}

// SSHRoute reports whether TCP connections to host (the name the guest
// looked up, or "") at ip and port belong to the SSH gateway: some ssh
// allow rule names that host (or address) and port, for some user. The
// gateway then terminates the connection and decides the user with
// DecideSSH, so deny rules apply to every connection it takes. Deny rules
// alone route nothing: a `host: "*"` deny over all ports must not pull
// every flow into the SSH gateway, and a host pattern of only wildcards
// does not route private addresses. Always-closed destinations are never
// routed (the network gateway refuses them). The decision names the rule.
func (p *Profile) SSHRoute(host string, ip netip.Addr, port uint16) (Decision, bool) {
	name, hostIP, bad := splitHost(host)
	if bad != "" || closedName(name) || name == hostInternal {
		return Decision{}, false
	}
	if hostIP.IsValid() {
		ip = hostIP
	}
	ip = canonicalIP(ip)
	if ip.IsValid() && closedIP(ip) != nil {
		return Decision{}, false
	}
	if name == "" {
		if !ip.IsValid() {
			return Decision{}, false
		}
		name = ip.String()
	}
	private := ip.IsValid() && isPrivate(ip)
	for i := range p.c.sshAllow {
		if r := &p.c.sshAllow[i]; portIn(r.ports, port) && matchElement(r.host, name) && !(private && onlyWildcards(r.host)) {
			return allow(r.rule, "ssh to "+name+" port "+strconv.Itoa(int(port))+" goes through the SSH gateway"), true
		}
	}
	return Decision{}, false
}

// SSHUserHint returns the user of the ssh allow rule that SSHRoute would
// route host, ip and port by, when that rule names exactly one user (no
// glob), else "". The gateway may log in upstream as that user before the
// guest has said who it is; DecideSSH still decides the user the guest
// asks for.
func (p *Profile) SSHUserHint(host string, ip netip.Addr, port uint16) string {
	d, ok := p.SSHRoute(host, ip, port)
	if !ok {
		return ""
	}
	for i := range p.c.sshAllow {
		if r := &p.c.sshAllow[i]; r.rule == d.Rule {
			if r.user == "" || strings.ContainsAny(r.user, "*?") {
				return ""
			}
			return r.user
		}
	}
	return ""
}

// onlyWildcards reports whether a host glob names nothing literally ("*",
// "*.*"): like a network domain rule, such a pattern does not open private
// addresses, which must be named.
func onlyWildcards(glob string) bool { return strings.Trim(glob, "*?.") == "" }

// SSHName reports whether some ssh allow rule names host (on any port, for
// any user): the gateway's DNS then resolves it even when no network rule
// names it, so `ssh deploy@build1` works without opening build1 to the
// network.
func (p *Profile) SSHName(host string) (Decision, bool) {
	name, _, bad := splitHost(host)
	if bad != "" || name == "" || closedName(name) || name == hostInternal {
		return Decision{}, false
	}
	for i := range p.c.sshAllow {
		if matchElement(p.c.sshAllow[i].host, name) {
			return allow(p.c.sshAllow[i].rule, "ssh to "+name+" is allowed by an ssh rule"), true
		}
	}
	return Decision{}, false
}
