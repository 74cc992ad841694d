package policy

import (
	"net/netip"
	"path"
	"strconv"
	"strings"
)

// compiled is the form Decide reads: rule labels built once, globs split,
// deny and allow kept apart.
type compiled struct {
	mode      Mode
	modeRule  string
	allow     []netRule
	deny      []netRule
	ask       []netRule
	hostPorts []hostPort

	fileAllow []fileRule
	fileDeny  []fileRule

	repos []repoRule

	sshAllow []sshRule
	sshDeny  []sshRule

	probePorts []uint16 // see DecideName
}

type netRule struct {
	domain  string // normalised pattern, "" for a CIDR rule
	prefix  netip.Prefix
	private bool // prefix lies inside a private range: may open it
	ports   []PortRange
	proto   string
	rule    string // "file:line:col network.allow[3] domain *.github.com ports 443"
}

type hostPort struct {
	port uint16
	rule string
}

type fileRule struct {
	segs          []string
	fold          []string // segs case-folded (foldName), for FileMount.FoldCase
	access        Access
	literal, wild int
	rule          string
}

type repoRule struct {
	segs                          []string
	read, push, delete, forcePush Verdict
	refs                          []refRule
	pushOptions                   []string
	rule                          string
}

type refRule struct {
	segs []string
	// fold is segs lower-cased: a deny also matches a ref that differs
	// only in case, since a server that keeps refs as files on a
	// case-insensitive disk updates the same ref for both spellings.
	fold                    []string
	push, delete, forcePush Verdict
	rule                    string
}

type sshRule struct {
	host, user string
	ports      []PortRange
	ask        bool
	rule       string
	idx        int // index in Profile.SSH.Allow or .Deny
}

func label(p Pos, where, desc string) string { return p.String() + " " + where + " " + desc }

func portsDesc(ps []PortRange) string {
	if len(ps) == 0 {
		return ""
	}
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return " ports " + strings.Join(s, ",")
}

func compileNet(rs []NetRule) []netRule {
	out := make([]netRule, 0, len(rs))
	for _, r := range rs {
		desc := "domain " + r.Domain
		if r.Domain == "" {
			desc = "cidr " + r.CIDR.String()
		}
		if r.Proto != "" {
			desc += " proto " + r.Proto
		}
		out = append(out, netRule{
			domain: r.Domain, prefix: r.CIDR, private: r.Domain == "" && insidePrivate(r.CIDR),
			ports: r.Ports, proto: r.Proto, rule: label(r.Pos, r.Where, desc+portsDesc(r.Ports)),
		})
	}
	return out
}

func compile(p *Profile) compiled {
	c := compiled{mode: p.Network.Mode, allow: compileNet(p.Network.Allow), deny: compileNet(p.Network.Deny),
		ask: compileNet(p.Network.Ask), probePorts: probePorts(p.Network)}
	if p.Network.ModePos.File != "" {
		c.modeRule = label(p.Network.ModePos, "network.mode", string(c.mode))
	} else {
		c.modeRule = "network.mode " + string(c.mode) + " (default)"
	}
	for _, hp := range p.Network.HostPorts {
		c.hostPorts = append(c.hostPorts, hostPort{hp.Port, label(hp.Pos, "network.host_ports", strconv.Itoa(int(hp.Port)))})
	}
	for _, r := range p.Files.Rules {
		lit, wild := globWeight(r.Path)
		fr := fileRule{segs: splitGlob(r.Path), fold: splitGlob(foldName(r.Path)), access: r.Access, literal: lit, wild: wild,
			rule: label(r.Pos, r.Where, string(r.Access)+" "+r.Path)}
		if r.Access == NoAccess {
			c.fileDeny = append(c.fileDeny, fr)
		} else {
			c.fileAllow = append(c.fileAllow, fr)
		}
	}
	for _, r := range p.Git.Repos {
		rr := repoRule{segs: splitGlob(r.Repo), read: r.Read, push: r.Push, delete: r.Delete, forcePush: r.ForcePush,
			pushOptions: r.PushOptions, rule: label(r.Pos, r.Where, "repo "+r.Repo)}
		for _, f := range r.Refs {
			rr.refs = append(rr.refs, refRule{segs: splitGlob(f.Ref), fold: splitGlob(strings.ToLower(f.Ref)), push: f.Push, delete: f.Delete, forcePush: f.ForcePush,
				rule: label(f.Pos, f.Where, "repo "+r.Repo+" ref "+f.Ref)})
		}
		c.repos = append(c.repos, rr)
	}
	for _, list := range []struct {
		src []SSHRule
		dst *[]sshRule
	}{{p.SSH.Allow, &c.sshAllow}, {p.SSH.Deny, &c.sshDeny}} {
		for i, r := range list.src {
			desc := "host " + r.Host
			if r.User != "" {
				desc += " user " + r.User
			}
			if r.Ask {
				desc += " ask"
			}
			*list.dst = append(*list.dst, sshRule{host: r.Host, user: r.User, ports: r.Ports, ask: r.Ask,
				rule: label(r.Pos, r.Where, desc+portsDesc(r.Ports)), idx: i})
		}
	}
	return c
}

func allow(rule, reason string) Decision { return Decision{Allow: true, Rule: rule, Reason: reason} }
func deny(rule, reason string) Decision  { return Decision{Rule: rule, Reason: reason} }
func ask(rule, reason string) Decision   { return Decision{Ask: true, Rule: rule, Reason: reason} }

func portIn(ps []PortRange, port uint16) bool {
	if len(ps) == 0 {
		return true
	}
	for _, r := range ps {
		if port >= r.Lo && port <= r.Hi {
			return true
		}
	}
	return false
}

// Decide returns the verdict on r. It is pure, safe for concurrent use, and
// denies anything it does not understand (unknown kinds, malformed hosts,
// paths or refs).
func (p *Profile) Decide(r Request) Decision {
	switch r.Kind {
	case KindNet:
		return p.decideNet(r)
	case KindFile:
		return p.decideFile(r, true)
	case KindGit:
		return p.decideGit(r)
	case KindSSH:
		return p.decideSSH(r)
	}
	return deny("builtin: malformed request", "unknown request kind "+r.Kind.String())
}

func (p *Profile) decideNet(r Request) Decision { return p.decideNetAs(r, "") }

// decideNetAs is decideNet; a non-empty target replaces the request's own
// description in reasons (DecideName describes a name on every port).
func (p *Profile) decideNetAs(r Request, as string) Decision {
	proto := r.Proto
	if proto == "" {
		proto = "tcp"
	}
	if proto != "tcp" && proto != "udp" {
		return deny("builtin: malformed request", "protocol "+strconv.Quote(r.Proto)+" is not tcp or udp")
	}
	host, hostIP, bad := splitHost(r.Host)
	if bad != "" {
		return deny("builtin: malformed request", "host "+strconv.Quote(r.Host)+": "+bad)
	}
	ip := canonicalIP(r.IP)
	if hostIP.IsValid() {
		hostIP = canonicalIP(hostIP)
		if ip.IsValid() && ip != hostIP {
			return deny("builtin: malformed request", "host "+r.Host+" and IP "+r.IP.String()+" disagree")
		}
		ip = hostIP
	}
	if host == "" && !ip.IsValid() {
		return deny("builtin: malformed request", "no host or IP")
	}
	if r.Port == 0 {
		return deny("builtin: malformed request", "port 0")
	}
	target := func() string {
		if as != "" {
			return as
		}
		t := host
		if t == "" {
			t = ip.String()
		} else if ip.IsValid() {
			t += " (" + ip.String() + ")"
		}
		return proto + " " + t + " port " + strconv.Itoa(int(r.Port))
	}

	if host == hostInternal {
		if ip.IsValid() && !ip.IsLoopback() {
			return deny("builtin: malformed request", hostInternal+" must be dialled on host loopback, not "+ip.String())
		}
		for _, hp := range p.c.hostPorts {
			if hp.port == r.Port {
				return allow(hp.rule, "host loopback port "+strconv.Itoa(int(r.Port))+" is exposed by network.host_ports")
			}
		}
		return deny("builtin: host loopback is always closed", target()+" is not in network.host_ports")
	}
	if closedName(host) {
		return deny("builtin: localhost and metadata names are always closed", target()+" names the host or cloud metadata; no profile can open it")
	}
	if ip.IsValid() {
		if c := closedIP(ip); c != nil {
			return deny(c.rule, target()+" is "+c.what+"; no profile can open it")
		}
	}
	match := func(nr *netRule) bool {
		if nr.proto != "" && nr.proto != proto || !portIn(nr.ports, r.Port) {
			return false
		}
		if nr.domain != "" {
			return host != "" && matchDomain(nr.domain, host)
		}
		return ip.IsValid() && nr.prefix.Contains(ip)
	}
	for i := range p.c.deny {
		if match(&p.c.deny[i]) {
			return deny(p.c.deny[i].rule, target()+" is denied (deny beats allow)")
		}
	}
	if ip.IsValid() && isPrivate(ip) {
		for i := range p.c.allow {
			if nr := &p.c.allow[i]; nr.private && match(nr) {
				return allow(nr.rule, target()+" is in a private range this rule names")
			}
		}
		for i := range p.c.ask {
			if nr := &p.c.ask[i]; nr.private && match(nr) {
				return ask(nr.rule, target()+" is in a private range this ask rule names")
			}
		}
		return deny(rulePrivate, target()+" is a private address; only an allow rule with a cidr inside the private range opens it")
	}
	// A domain rule opens UDP only when it says proto: udp. The gateway
	// holds a domain rule against what a TCP stream names (TLS server
	// name, HTTP Host); it does not read names inside UDP (QUIC carries
	// its server name in an encrypted Initial), so "any protocol" on a
	// name means TCP. A rule that would have matched but for this is
	// named in the refusal, so the fix is plain.
	var tcpOnly *netRule
	for i := range p.c.allow {
		nr := &p.c.allow[i]
		if !match(nr) {
			continue
		}
		if nr.domain != "" && nr.proto == "" && proto == "udp" {
			if tcpOnly == nil {
				tcpOnly = nr
			}
			continue
		}
		return allow(nr.rule, target()+" matches this allow rule")
	}
	for i := range p.c.ask {
		nr := &p.c.ask[i]
		if !match(nr) || nr.domain != "" && nr.proto == "" && proto == "udp" {
			continue
		}
		return ask(nr.rule, target()+" matches this ask rule")
	}
	if tcpOnly != nil && p.c.mode != AllowAll {
		return deny(tcpOnly.rule, target()+" matches this domain rule only for TCP: a domain rule opens UDP (e.g. QUIC) only with proto: udp")
	}
	switch p.c.mode {
	case AllowAll:
		return allow(p.c.modeRule, target()+" is allowed: the profile allows all egress that is not denied")
	case DenyAll:
		return deny(p.c.modeRule, target()+" is denied: the profile denies all egress")
	case AskMode:
		return ask(p.c.modeRule, "no rule names "+target()+"; network.mode ask puts it to the host user")
	}
	return deny(ruleDefault, "no rule allows "+target()+p.forgeHint(host))
}

// forgeHint is what a default-deny refusal of host adds when host is a
// forge the git rules name: those rules open no network path to it.
func (p *Profile) forgeHint(host string) string {
	if host == "" || !p.IsForge(host) {
		return ""
	}
	return "; the git rules name this forge, but they open no network path to it: a network.allow rule for " + host + " on port 443 does"
}

// cleanGuestPath refuses relative paths, NULs and any ".." element (the
// gateway hands over resolved paths; a ".." is an escape attempt), and
// cleans the rest.
func cleanGuestPath(p string) (string, string) {
	if p == "" || p[0] != '/' {
		return "", "path is not absolute"
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", "path contains NUL"
	}
	for s := p; s != ""; {
		var el string
		el, s, _ = strings.Cut(s, "/")
		if el == ".." {
			return "", "path contains a \"..\" element"
		}
	}
	return path.Clean(p), ""
}

// decideFile decides a file request; protect applies the protection of
// files the host runs (see protected).
func (p *Profile) decideFile(r Request, protect bool) Decision {
	return p.decideFileAs(r, protect, false)
}

// decideFileAs is decideFile; with fold, rules and path are compared
// case-folded (foldName).
func (p *Profile) decideFileAs(r Request, protect, fold bool) Decision {
	if r.Access != "ro" && r.Access != "rw" {
		return deny("builtin: malformed request", "file access "+strconv.Quote(r.Access)+" is not ro or rw")
	}
	clean, bad := cleanGuestPath(r.Path)
	if bad != "" {
		return deny("builtin: malformed request", strconv.Quote(r.Path)+": "+bad)
	}
	s := clean[1:]
	segs := func(f *fileRule) []string { return f.segs }
	if fold {
		s = foldName(s)
		segs = func(f *fileRule) []string { return f.fold }
	}
	for i := range p.c.fileDeny {
		if matchSegments(segs(&p.c.fileDeny[i]), s) {
			return deny(p.c.fileDeny[i].rule, clean+" is denied (deny beats allow)")
		}
	}
	// A file the host runs is writable only through an rw rule that
	// names it (see protected); other rw rules do not apply to it.
	prot, isProt := protection{}, false
	if r.Access == "rw" && protect {
		prot, isProt = protected(clean)
	}
	var best *fileRule
	for i := range p.c.fileAllow {
		f := &p.c.fileAllow[i]
		if !matchSegments(segs(f), s) {
			continue
		}
		// An ask rule would only put the change to the host user: one
		// that does not spell the protected elements out does not apply
		// either, so the change is refused (read-only), never asked.
		if isProt && f.access != ReadOnly && !opens(f.segs, prot.anchor) {
			continue
		}
		if best == nil || f.literal > best.literal ||
			f.literal == best.literal && (f.wild < best.wild || f.wild == best.wild && accessRank(f.access) > accessRank(best.access)) {
			best = f
		}
	}
	switch {
	case best == nil && isProt:
		return prot.refusal(clean)
	case best == nil:
		return deny(ruleDefault, "no files rule matches "+clean)
	case best.access == ReadOnly && r.Access == "rw":
		return deny(best.rule, clean+" is read-only under its most specific rule")
	case best.access == AskAccess || best.access == AskWrite && r.Access == "rw":
		return ask(best.rule, r.Access+" access to "+clean+" is asked of the host user by its most specific rule")
	}
	return allow(best.rule, r.Access+" access to "+clean+" is granted by its most specific rule")
}

// accessRank orders file rules of equal weight: the stricter wins a tie.
func accessRank(a Access) int {
	switch a {
	case AskAccess:
		return 3
	case ReadOnly:
		return 2
	case AskWrite:
		return 1
	}
	return 0
}

// normRepo lower-cases a repo path and drops ".git" and a trailing slash.
func normRepo(repo string) (string, string) {
	for i := 0; i < len(repo); i++ {
		if c := repo[i]; c >= 'A' && c <= 'Z' {
			repo = strings.ToLower(repo)
			break
		}
	}
	repo = strings.TrimSuffix(strings.TrimSuffix(repo, "/"), ".git")
	n := 0
	for s := repo; ; n++ {
		el, rest, more := strings.Cut(s, "/")
		if el == "" || el == "." || el == ".." {
			return "", "want FORGE/OWNER/NAME with no empty, . or .. elements"
		}
		for i := 0; i < len(el); i++ {
			if c := el[i]; c <= ' ' || c == 0x7f || c == '*' || c == '?' || c == ':' || c == '\\' {
				return "", "unexpected character in repo"
			}
		}
		if !more {
			break
		}
		s = rest
	}
	if n < 1 {
		return "", "want FORGE/OWNER/NAME"
	}
	forge, _, _ := strings.Cut(repo, "/")
	if msg := checkHostname(forge); msg != "" {
		if _, err := netip.ParseAddr(forge); err != nil {
			return "", "forge " + strconv.Quote(forge) + ": " + msg
		}
	}
	return repo, ""
}

// checkRefName applies the parts of git check-ref-format that matter for
// matching: full names under refs/, no "..", no empty or dot-leading
// elements, no glob or control characters.
func checkRefName(ref string) string {
	if !strings.HasPrefix(ref, "refs/") || strings.HasSuffix(ref, "/") || strings.HasSuffix(ref, ".lock") ||
		strings.HasSuffix(ref, ".") || strings.Contains(ref, "..") || strings.Contains(ref, "//") || strings.Contains(ref, "@{") {
		return "not a valid full ref name such as refs/heads/main"
	}
	for i := 0; i < len(ref); i++ {
		switch c := ref[i]; {
		case c <= ' ' || c == 0x7f || c == '~' || c == '^' || c == ':' || c == '?' || c == '*' || c == '[' || c == '\\':
			return "not a valid full ref name such as refs/heads/main"
		case c == '.' && ref[i-1] == '/':
			return "ref elements cannot start with '.'"
		}
	}
	return ""
}

func (p *Profile) decideGit(r Request) Decision {
	repo, bad := normRepo(r.Repo)
	if bad != "" {
		return deny("builtin: malformed request", "repo "+strconv.Quote(r.Repo)+": "+bad)
	}
	forge, _, _ := strings.Cut(repo, "/")
	if closedName(forge) {
		return deny("builtin: localhost and metadata names are always closed", "forge "+forge+" names the host")
	}
	if a, err := netip.ParseAddr(forge); err == nil {
		if c := closedIP(canonicalIP(a)); c != nil {
			return deny(c.rule, "forge "+forge+" is "+c.what)
		}
	}
	if r.Access == "read" {
		for i := range p.c.repos {
			if rr := &p.c.repos[i]; rr.read == Deny && matchSegments(rr.segs, repo) {
				return deny(rr.rule, "reading "+repo+" is denied")
			}
		}
		for i := range p.c.repos {
			if rr := &p.c.repos[i]; rr.read == Allow && matchSegments(rr.segs, repo) {
				return allow(rr.rule, "reading "+repo+" is allowed")
			}
		}
		return deny(ruleDefault, "no git rule allows reading "+repo)
	}
	var pick func(push, del, force Verdict) Verdict
	switch r.Access {
	case "push":
		pick = func(push, _, _ Verdict) Verdict { return push }
	case "delete":
		pick = func(_, del, _ Verdict) Verdict { return del }
	case "force-push":
		pick = func(_, _, force Verdict) Verdict { return force }
	default:
		return deny("builtin: malformed request", "git access "+strconv.Quote(r.Access)+" is not read, push, delete or force-push")
	}
	if bad := checkRefName(r.Ref); bad != "" {
		return deny("builtin: malformed request", "ref "+strconv.Quote(r.Ref)+": "+bad)
	}
	if d, ok := p.decidePushOnly(r, repo); ok {
		return d
	}
	what := r.Access + " of " + r.Ref + " in " + repo
	folded := strings.ToLower(r.Ref)
	// Denies first: a push deny also stops deletes and force pushes.
	for i := range p.c.repos {
		rr := &p.c.repos[i]
		if !matchSegments(rr.segs, repo) {
			continue
		}
		if rr.push == Deny || pick(rr.push, rr.delete, rr.forcePush) == Deny {
			return deny(rr.rule, what+" is denied (deny beats allow)")
		}
		for j := range rr.refs {
			f := &rr.refs[j]
			if (f.push == Deny || pick(f.push, f.delete, f.forcePush) == Deny) && (matchSegments(f.segs, r.Ref) || matchSegments(f.fold, folded)) {
				return deny(f.rule, what+" is denied (deny beats allow)")
			}
		}
	}
	// Ref rules before repository rules (the more specific first); at
	// each level an allow beats an ask, so a ref rule that `smx approve
	// --always` added after an ask rule takes effect.
	for _, want := range []Verdict{Allow, Ask} {
		for i := range p.c.repos {
			rr := &p.c.repos[i]
			if !matchSegments(rr.segs, repo) {
				continue
			}
			for j := range rr.refs {
				f := &rr.refs[j]
				v := pick(f.push, f.delete, f.forcePush)
				if v != want || !matchSegments(f.segs, r.Ref) && !(v == Ask && matchSegments(f.fold, folded)) {
					continue
				}
				if v == Allow {
					return allow(f.rule, what+" is allowed")
				}
				return ask(f.rule, what+" is asked of the host user")
			}
		}
	}
	for _, want := range []Verdict{Allow, Ask} {
		for i := range p.c.repos {
			rr := &p.c.repos[i]
			if !matchSegments(rr.segs, repo) || pick(rr.push, rr.delete, rr.forcePush) != want {
				continue
			}
			if want == Allow {
				return allow(rr.rule, what+" is allowed")
			}
			return ask(rr.rule, what+" is asked of the host user")
		}
	}
	if r.Access != "push" {
		return deny(ruleDefault, what+" needs a rule with "+strings.ReplaceAll(r.Access, "-", "_")+": allow")
	}
	return deny(ruleDefault, "no git rule allows "+what)
}

func (p *Profile) decideSSH(r Request) Decision {
	d, _ := p.decideSSHRule(r)
	return d
}

// decideSSHRule decides r and returns the index in p.SSH.Allow of the rule
// that allowed it (-1 when denied).
func (p *Profile) decideSSHRule(r Request) (Decision, int) {
	host, hostIP, bad := splitHost(r.Host)
	if bad != "" {
		return denyN("builtin: malformed request", "host "+strconv.Quote(r.Host)+": "+bad)
	}
	ip := canonicalIP(r.IP)
	if hostIP.IsValid() {
		if ip.IsValid() && ip != canonicalIP(hostIP) {
			return denyN("builtin: malformed request", "host "+r.Host+" and IP "+r.IP.String()+" disagree")
		}
		ip = canonicalIP(hostIP)
	}
	name := host
	if name == "" {
		if !ip.IsValid() {
			return denyN("builtin: malformed request", "no host or IP")
		}
		name = ip.String()
	}
	port := r.Port
	if port == 0 {
		port = 22
	}
	if r.User == "" || !userRE(r.User) {
		return denyN("builtin: malformed request", "user "+strconv.Quote(r.User)+" is not a plain user name")
	}
	what := r.User + "@" + name + " port " + strconv.Itoa(int(port))
	if closedName(host) || host == hostInternal {
		return denyN("builtin: localhost and metadata names are always closed", "ssh to "+what+" would reach the host")
	}
	if ip.IsValid() {
		if c := closedIP(ip); c != nil {
			return denyN(c.rule, "ssh to "+what+": "+c.what+" is always closed")
		}
	}
	match := func(s *sshRule) bool {
		return portIn(s.ports, port) && matchElement(s.host, name) && (s.user == "" || matchElement(s.user, r.User))
	}
	for i := range p.c.sshDeny {
		if match(&p.c.sshDeny[i]) {
			return denyN(p.c.sshDeny[i].rule, "ssh to "+what+" is denied (deny beats allow)")
		}
	}
	private := ip.IsValid() && isPrivate(ip)
	skipped := false
	// An allow rule beats one that asks (a rule `smx approve --always`
	// added after an ask rule takes effect).
	for _, asking := range []bool{false, true} {
		for i := range p.c.sshAllow {
			if a := &p.c.sshAllow[i]; a.ask == asking && match(a) {
				if private && onlyWildcards(a.host) {
					skipped = true
					continue
				}
				if a.ask {
					return ask(a.rule, "ssh to "+what+" is asked of the host user"), a.idx
				}
				return allow(a.rule, "ssh to "+what+" is allowed"), a.idx
			}
		}
	}
	if skipped {
		return denyN(rulePrivate, "ssh to "+what+": "+ip.String()+" is a private address; a host pattern of only wildcards does not open it, name the host")
	}
	return denyN(ruleDefault, "no ssh rule allows "+what)
}

func denyN(rule, reason string) (Decision, int) { return deny(rule, reason), -1 }

func userRE(u string) bool {
	if len(u) > 64 {
		return false
	}
	for i := 0; i < len(u); i++ {
		c := u[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// CredentialFor returns the credential bound to where r goes: a Net request
// to a credential's domain, a Git request to its forge, an SSH request to its
// host. It does not decide whether r may happen: call it only after Decide
// has allowed r.
func (p *Profile) CredentialFor(r Request) (Credential, bool) {
	switch r.Kind {
	case KindNet:
		host, _, bad := splitHost(r.Host)
		if bad != "" || host == "" {
			return Credential{}, false
		}
		for _, c := range p.Credentials {
			if c.Domain != "" && matchDomain(c.Domain, host) {
				return c, true
			}
		}
	case KindGit:
		repo, bad := normRepo(r.Repo)
		if bad != "" {
			return Credential{}, false
		}
		forge, _, _ := strings.Cut(repo, "/")
		for _, c := range p.Credentials {
			if c.Forge != "" && c.Forge == forge {
				return c, true
			}
		}
	case KindSSH:
		host, ip, bad := splitHost(r.Host)
		if bad != "" {
			return Credential{}, false
		}
		if host == "" && ip.IsValid() {
			host = ip.String()
		}
		for _, c := range p.Credentials {
			if c.SSHHost != "" && host != "" && matchElement(c.SSHHost, host) {
				return c, true
			}
		}
	}
	return Credential{}, false
}

// DecideName decides whether a name may be resolved at all: it is allowed
// when some connection to it could be allowed (the name with no address,
// on both protocols and on one port of every port range the rules
// distinguish). A refusal speaks of the name on every port, not of one
// port it happened to try. The gateway's DNS server uses it, so a
// default-deny profile resolves only the names its rules allow. A name
// no connection to which could be allowed but some could be asked about
// (an ask rule naming it on some port, network.mode ask) is Ask: it is
// resolved, and the question is put when a flow to it opens, where its
// first bytes name the host.
func (p *Profile) DecideName(host string) Decision {
	var first, asked Decision
	for i, proto := range []string{"tcp", "udp"} {
		for j, port := range p.c.probePorts {
			d := p.decideNetAs(Request{Kind: KindNet, Proto: proto, Host: host, Port: port}, "")
			if d.Allow {
				return d
			}
			if d.Ask && !asked.Ask {
				asked = p.decideNetAs(Request{Kind: KindNet, Proto: proto, Host: host, Port: port}, "the name "+host)
			}
			if i == 0 && j == 0 {
				first = p.decideNetAs(Request{Kind: KindNet, Proto: proto, Host: host, Port: port}, "the name "+host+" on every port")
				if first.Rule == ruleDefault {
					first.Reason = "no rule allows " + host + " on any port, so the name is not resolved" + p.forgeHint(host)
				}
			}
		}
	}
	if asked.Ask && !first.Ask {
		return asked
	}
	return first
}

// probePorts returns one port from every interval on which the network
// rules cannot change their verdict for a given name: 1, and the first
// port of every range and the port after it.
func probePorts(n Network) []uint16 {
	seen := map[uint16]bool{1: true}
	out := []uint16{1}
	add := func(port int) {
		if port >= 1 && port <= 65535 && !seen[uint16(port)] {
			seen[uint16(port)] = true
			out = append(out, uint16(port))
		}
	}
	for _, rules := range [][]NetRule{n.Allow, n.Deny, n.Ask} {
		for _, r := range rules {
			for _, pr := range r.Ports {
				add(int(pr.Lo))
				add(int(pr.Hi) + 1)
			}
		}
	}
	for _, hp := range n.HostPorts {
		add(int(hp.Port))
	}
	return out
}
