// Package learn writes a security profile from what a sandbox did: the
// smallest profile (internal/policy) that would have allowed every action
// its audit log records, as YAML whose every rule carries a comment naming
// the records it came from. It is `smx profile learn`, an audit2allow for
// smx: run an agent under `open` (or under a profile that asks), then learn
// the profile to run it under next time.
//
// Learn is pure: it reads records the caller has already verified
// (service.LearnProfile verifies the hash chain and signed checkpoints
// first and passes only what a signature covers) and does no I/O.
package learn

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/policy"
)

// Thresholds of the collapsing rules.
const (
	// MinSubdomains is how many distinct names directly under one parent
	// domain the run must have reached before the parent becomes a
	// wildcard rule (*.parent): one name is never generalised.
	MinSubdomains = 2
	// MinFilesInDir is how many paths directly in one directory the run
	// must have written before the directory becomes DIR/** rw. A
	// directory the run created itself becomes DIR/** at once: all in it
	// is the run's own.
	MinFilesInDir = 3
)

// Options tune Learn.
type Options struct {
	// Name is the profile's name; "" leaves it out (the file name then
	// names it).
	Name string
	// Refused also learns what policy refused (not the built-in
	// refusals: always-closed addresses, malformed requests, the
	// gateways' own limits, which no profile can open). Off by default:
	// a refusal may be policy working (an exfiltration attempt), and
	// turning every refusal into a rule would launder it into the next
	// run's profile. What an `ask` session approved is in the log as
	// allowed and is learned either way.
	Refused bool
	// Source names where the records came from, for the header comment
	// (e.g. "sandbox web, log seq 0-812").
	Source string
}

// Result is a learned profile.
type Result struct {
	YAML []byte
	// Notes say what was not learned and why, and which recorded
	// actions the learned profile would still refuse (none, normally).
	Notes []string
	// Rules counts the rules written, by section.
	Rules map[string]int
}

// origin lists the records a rule came from: kind → seqs.
type origin map[string][]int64

func (o origin) add(r audit.Record) {
	if !slices.Contains(o[r.Kind], r.Seq) {
		o[r.Kind] = append(o[r.Kind], r.Seq)
	}
}

func (o origin) merge(p origin) {
	for k, ss := range p {
		for _, s := range ss {
			if !slices.Contains(o[k], s) {
				o[k] = append(o[k], s)
			}
		}
	}
}

// maxSeqs is how many seqs a comment lists per kind before "+N more".
const maxSeqs = 6

// String renders o as the comment text: "from net.flow 12 15, file.write 20".
func (o origin) String() string {
	kinds := make([]string, 0, len(o))
	for k := range o {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var parts []string
	for _, k := range kinds {
		ss := slices.Clone(o[k])
		slices.Sort(ss)
		var b strings.Builder
		b.WriteString(k)
		for i, s := range ss {
			if i == maxSeqs {
				fmt.Fprintf(&b, " (+%d more)", len(ss)-maxSeqs)
				break
			}
			b.WriteString(" #" + strconv.FormatInt(s, 10))
		}
		parts = append(parts, b.String())
	}
	return "from " + strings.Join(parts, ", ")
}

// refusedBy reports whether r is a refusal learn may turn into a rule
// (opt.Refused), and false for built-in refusals no profile opens.
func learnable(r audit.Record, opt Options) bool {
	if !r.Refusal() {
		return true
	}
	if !opt.Refused {
		return false
	}
	rule := str(r.Fields, "rule")
	for _, p := range []string{"builtin:", "netstack:", "gitgw:", "sshgw:", "fsgw:"} {
		if strings.HasPrefix(rule, p) {
			return false
		}
	}
	return true
}

func str(f map[string]any, k string) string { s, _ := f[k].(string); return s }

func boolField(f map[string]any, k string) bool { b, _ := f[k].(bool); return b }

// learner accumulates what the records show, section by section.
type learner struct {
	opt   Options
	notes []string

	nets      map[netKey]*netRule
	hostPorts map[uint16]origin
	mounts    map[string]origin // rw mounts (guest path) seen
	writes    map[string]*fileWrite
	overflow  map[string]origin // mounts whose writes overflowed the gateway's notes
	repos     map[string]*repoRule
	ssh       map[sshKey]*sshRule
	sshDsts   map[string]bool // dst addresses of SSH sessions: their net.flow is the SSH rule's
	creds     map[string]*credRule
	replays   []replay
	skipped   map[string]int
	refusedIn int // refusals learned
}

type netKey struct {
	domain, cidr, proto string
}

type netRule struct {
	netKey
	ports map[uint16]bool
	from  origin
	names []string // for a wildcard: the names it stands for
}

type fileWrite struct {
	path, mount string
	dir         bool // the run created it as a directory
	from        origin
}

type repoRule struct {
	repo    string
	read    bool
	refs    map[string]*refRule
	options map[string]bool
	from    origin
}

type refRule struct {
	ref              string
	push, del, force bool
	from             origin
}

type sshKey struct {
	host, user string
}

type sshRule struct {
	sshKey
	ports   map[uint16]bool
	sftp    bool
	forward map[string]bool
	env     map[string]bool
	from    origin
}

type credRule struct {
	name, from, domain, header, format, forge, sshHost string
	methods                                            map[string]bool
	origin                                             origin
}

// replay is one recorded action to decide again under the learned profile.
type replay struct {
	seq  int64
	kind string
	req  policy.Request
	m    *policy.FileMount
}

// Learn returns the smallest profile that allows what recs (one
// sandbox's verified log, in order) show it did. Records before the last
// sandbox.create belong to an earlier sandbox of the same name and are
// ignored.
func Learn(recs []audit.Record, opt Options) (*Result, error) {
	start := 0
	for i, r := range recs {
		if r.Kind == audit.KindSandboxCreate {
			start = i
		}
	}
	l := &learner{opt: opt, nets: map[netKey]*netRule{}, hostPorts: map[uint16]origin{}, mounts: map[string]origin{},
		writes: map[string]*fileWrite{}, overflow: map[string]origin{}, repos: map[string]*repoRule{},
		ssh: map[sshKey]*sshRule{}, sshDsts: map[string]bool{}, creds: map[string]*credRule{}, skipped: map[string]int{}}
	recs = recs[start:]
	// SSH first: the net.flow of an SSH connection is the SSH rule's,
	// not a network rule's.
	for _, r := range recs {
		if (r.Kind == audit.KindSSHSession || r.Kind == audit.KindSSHForward) && learnable(r, opt) {
			l.sshDsts[str(r.Fields, "dst")] = true
		}
	}
	for _, r := range recs {
		l.record(r)
	}
	return l.result()
}

func (l *learner) skip(why string) { l.skipped[why]++ }

func (l *learner) record(r audit.Record) {
	f := r.Fields
	if r.Kind == audit.KindSandboxCreate {
		l.createMounts(r)
		return
	}
	if (r.Kind == audit.KindSSHSession || r.Kind == audit.KindSSHForward) && r.Refusal() && !l.opt.Refused {
		// The connection was allowed, a request in it was not: learn the
		// host, not what was refused in it.
		l.sshRecord(r, false)
		l.skip("refusals (learn them too with --include-refused)")
		return
	}
	if !learnable(r, l.opt) {
		if r.Refusal() && !l.opt.Refused {
			l.skip("refusals (learn them too with --include-refused)")
		} else if r.Refusal() {
			l.skip("built-in refusals (no profile opens them)")
		}
		return
	}
	if r.Refusal() {
		l.refusedIn++
	}
	switch r.Kind {
	case audit.KindNetFlow, audit.KindNetRefused:
		l.flow(r)
	case audit.KindFileWrite:
		l.fileWrite(r)
	case audit.KindFileRefused:
		switch str(f, "op") {
		case "create", "write", "mkdir", "symlink", "link", "rename", "unlink", "setattr", "setxattr", "removexattr", "lock":
			l.fileWrite(r)
		case "open":
			// An open refused for reading is a hidden path; reads are the
			// mount's (see mountRules), so only writes are learned.
		}
	case audit.KindGitPush:
		l.gitPush(r)
		l.gitCred(r)
	case audit.KindGitFetch:
		if repo := str(f, "repo"); repo != "" {
			l.repo(repo, r).read = true
			l.gitCred(r)
		}
	case audit.KindGitRefused:
		l.gitRefused(r)
	case audit.KindSSHSession, audit.KindSSHForward, audit.KindSSHRefused:
		l.sshRecord(r, true)
	case audit.KindCredUse:
		l.credUse(r)
	}
}

// createMounts notes the sandbox's read-write -v mounts: their reads are
// never logged, so the learned profile keeps them readable, and writable
// only where the run wrote.
func (l *learner) createMounts(r audit.Record) {
	ms, _ := r.Fields["mounts"].([]any)
	for _, m := range ms {
		s, _ := m.(string)
		guest, ro := mountGuest(s)
		if guest != "" && !ro {
			if l.mounts[guest] == nil {
				l.mounts[guest] = origin{}
			}
			l.mounts[guest].add(r)
		}
	}
}

// mountGuest parses a mount as sandbox.create records it
// (HOST:GUEST[:OPTIONS]): the guest path and whether it is read-only.
func mountGuest(s string) (string, bool) {
	parts := strings.Split(s, ":")
	for i := 1; i < len(parts); i++ {
		if strings.HasPrefix(parts[i], "/") {
			ro := false
			if i+1 < len(parts) {
				for _, o := range strings.Split(parts[i+1], ",") {
					ro = ro || o == "ro"
				}
			}
			return parts[i], ro
		}
	}
	return "", false
}

func (l *learner) flow(r audit.Record) {
	f := r.Fields
	proto := str(f, "proto")
	if proto == "dns" {
		// A lookup the profile refused: the guest never got to connect,
		// so no port is known. Learned (with --include-refused) as the
		// name on any TCP port; the comment says so.
		n := strings.TrimSuffix(strings.ToLower(str(f, "host")), ".")
		if !r.Refusal() || !hostname(n) {
			l.skip("name lookups with no connection (no port to learn)")
			return
		}
		l.net(netKey{domain: n}, 0, r)
		l.replays = append(l.replays, replay{seq: r.Seq, kind: r.Kind, req: policy.Request{Kind: policy.KindNet, Proto: "tcp", Host: n, Port: 443}})
		return
	}
	if proto != "tcp" && proto != "udp" {
		l.skip("flows of other protocols")
		return
	}
	dst := str(f, "dst")
	if l.sshDsts[dst] && proto == "tcp" {
		return // the SSH rule covers it
	}
	ap, err := netip.ParseAddrPort(dst)
	if err != nil {
		l.skip("flows with no destination port")
		return
	}
	port := ap.Port()
	names := flowNames(f)
	if slices.Contains(names, "host.smx.internal") {
		if l.hostPorts[port] == nil {
			l.hostPorts[port] = origin{}
		}
		l.hostPorts[port].add(r)
		return
	}
	ip := ap.Addr().Unmap()
	if len(names) == 0 || private(ip) {
		// No name: the address itself. A private address needs its own
		// cidr rule even with a name: a domain rule never opens one
		// (docs/profiles.md, DNS rebinding).
		bits := 32
		if ip.Is6() {
			bits = 128
		}
		l.net(netKey{cidr: netip.PrefixFrom(ip, bits).String(), proto: proto}, port, r)
	}
	for _, n := range names {
		k := netKey{domain: n}
		if proto == "udp" {
			k.proto = "udp"
		}
		l.net(k, port, r)
	}
	if len(names) == 0 {
		names = []string{""}
	}
	for _, n := range names {
		l.replays = append(l.replays, replay{seq: r.Seq, kind: r.Kind,
			req: policy.Request{Kind: policy.KindNet, Proto: proto, Host: n, IP: ip, Port: port}})
	}
}

var cgnat = netip.MustParsePrefix("100.64.0.0/10")

// private reports whether ip is in a range the policy keeps closed unless
// a cidr rule names it.
func private(ip netip.Addr) bool { return ip.IsPrivate() || cgnat.Contains(ip) }

// flowNames are the names a flow was for: the name the guest looked up,
// the TLS server name and the HTTP host, each once, lower case.
func flowNames(f map[string]any) []string {
	var out []string
	for _, k := range []string{"host", "sni", "http_host"} {
		n := strings.TrimSuffix(strings.ToLower(str(f, k)), ".")
		if h, _, err := net.SplitHostPort(n); err == nil {
			n = h
		}
		if n == "" || !strings.Contains(n, ".") && n != "localhost" {
			continue
		}
		if _, err := netip.ParseAddr(n); err == nil {
			continue // an address literal is not a domain
		}
		if !hostname(n) {
			continue // what the guest sent as a name is not one: never a rule
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// hostname reports whether n is a DNS name a domain rule can hold: lower
// case letters, digits, '-' and '_' in dot-separated labels of 1-63, at
// most 253 in all. The names in flow records are what the guest sent (a
// TLS server name, a Host header), so they are checked, not trusted.
func hostname(n string) bool {
	if len(n) == 0 || len(n) > 253 {
		return false
	}
	for _, l := range strings.Split(n, ".") {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

func (l *learner) net(k netKey, port uint16, r audit.Record) {
	nr := l.nets[k]
	if nr == nil {
		nr = &netRule{netKey: k, ports: map[uint16]bool{}, from: origin{}}
		l.nets[k] = nr
	}
	nr.ports[port] = true // 0: any port (a refused lookup)
	nr.from.add(r)
}

func (l *learner) fileWrite(r audit.Record) {
	f := r.Fields
	mount := str(f, "mount")
	if boolField(f, "overflow") {
		if l.overflow[mount] == nil {
			l.overflow[mount] = origin{}
		}
		l.overflow[mount].add(r)
		return
	}
	p := str(f, "path")
	if p == "" || !strings.HasPrefix(p, "/") || p == "*" {
		return
	}
	if mount != "" && l.mounts[mount] == nil {
		l.mounts[mount] = origin{}
	}
	w := l.writes[p]
	if w == nil {
		w = &fileWrite{path: p, mount: mount, from: origin{}}
		l.writes[p] = w
	}
	w.dir = w.dir || str(f, "op") == "mkdir"
	w.from.add(r)
	fm := policy.FileMount{Guest: mount, Rule: "-v (the run's mount)"}
	l.replays = append(l.replays, replay{seq: r.Seq, kind: r.Kind, req: policy.Request{Kind: policy.KindFile, Path: p, Access: "rw"}, m: &fm})
}

func (l *learner) repo(name string, r audit.Record) *repoRule {
	rr := l.repos[name]
	if rr == nil {
		rr = &repoRule{repo: name, refs: map[string]*refRule{}, options: map[string]bool{}, from: origin{}}
		l.repos[name] = rr
	}
	rr.from.add(r)
	return rr
}

func (rr *repoRule) ref(name string, r audit.Record) *refRule {
	f := rr.refs[name]
	if f == nil {
		f = &refRule{ref: name, from: origin{}}
		rr.refs[name] = f
	}
	f.from.add(r)
	return f
}

func (l *learner) gitPush(r audit.Record) {
	repo := str(r.Fields, "repo")
	if repo == "" {
		return
	}
	refs, _ := r.Fields["refs"].([]any)
	var rr *repoRule
	for _, x := range refs {
		m, _ := x.(map[string]any)
		if m == nil || str(m, "result") == "refused" {
			continue // its git.refused record says why; learned from there with --include-refused
		}
		if rr == nil {
			rr = l.repo(repo, r)
			rr.read = true // every request of a push is decided as a read first
		}
		l.gitRef(rr, str(m, "ref"), str(m, "access"), boolField(m, "forced"), r)
	}
	if rr != nil {
		if opts, ok := r.Fields["push_options"].([]any); ok {
			for _, o := range opts {
				s, _ := o.(string)
				name, _, _ := strings.Cut(s, "=")
				rr.options[name] = true
			}
		}
	}
}

func (l *learner) gitRef(rr *repoRule, ref, access string, forced bool, r audit.Record) {
	if ref == "" {
		return
	}
	f := rr.ref(ref, r)
	switch access {
	case "delete":
		f.del = true
	case "force-push":
		f.push, f.force = true, true
	case "push":
		f.push = true
		f.force = f.force || forced
	default:
		return
	}
	acc := access
	if acc == "push" && forced {
		acc = "force-push"
	}
	l.replays = append(l.replays, replay{seq: r.Seq, kind: r.Kind, req: policy.Request{Kind: policy.KindGit, Access: acc, Repo: rr.repo, Ref: ref}})
}

// gitCred learns the forge credential a Git request through the gateway
// carried (its git.fetch and git.push records name it).
func (l *learner) gitCred(r audit.Record) {
	name, repo := str(r.Fields, "credential"), str(r.Fields, "repo")
	if name == "" || repo == "" || str(r.Fields, "transport") == "ssh" {
		return
	}
	forge, _, _ := strings.Cut(repo, "/")
	c := l.cred(name, r)
	c.from, c.forge = str(r.Fields, "secret"), forge
}

func (l *learner) gitRefused(r audit.Record) {
	f := r.Fields
	repo := str(f, "repo")
	if repo == "" {
		return
	}
	rr := l.repo(repo, r)
	switch str(f, "op") {
	case "push":
		rr.read = true
		l.gitRef(rr, str(f, "ref"), str(f, "access"), false, r)
	default:
		rr.read = true
	}
}

// sshRecord learns the host, user and port of an SSH record; with what,
// also what the session did (sftp, forwarding, environment).
func (l *learner) sshRecord(r audit.Record, what bool) {
	f := r.Fields
	host := strings.ToLower(str(f, "host"))
	if host == "" {
		return
	}
	port, _ := strconv.Atoi(fmt.Sprint(f["port"]))
	if port <= 0 || port > 65535 {
		port = 22
	}
	k := sshKey{host: host, user: str(f, "user")}
	sr := l.ssh[k]
	if sr == nil {
		sr = &sshRule{sshKey: k, ports: map[uint16]bool{}, forward: map[string]bool{}, env: map[string]bool{}, from: origin{}}
		l.ssh[k] = sr
	}
	sr.ports[uint16(port)] = true
	sr.from.add(r)
	if c := str(f, "credential"); c != "" {
		from := str(f, "secret")
		if str(f, "auth") == "agent" {
			from = policy.SSHAgentSecret
		}
		l.cred(c, r).set(func(cr *credRule) { cr.from, cr.sshHost = from, host })
	}
	ip, _ := netip.ParseAddrPort(str(f, "dst"))
	l.replays = append(l.replays, replay{seq: r.Seq, kind: r.Kind, req: policy.Request{Kind: policy.KindSSH, Host: host, IP: ip.Addr(), User: k.user, Port: uint16(port)}})
	if !what {
		return
	}
	if strings.Contains(str(f, "command"), "subsystem sftp") || strings.Contains(str(f, "request"), "subsystem sftp") {
		sr.sftp = true
	}
	switch ch := str(f, "channel") + str(f, "request"); {
	case strings.Contains(ch, "direct-tcpip"):
		sr.forward[policy.ForwardLocal] = true
	case strings.Contains(ch, "tcpip-forward") || strings.Contains(ch, "forwarded-tcpip"):
		sr.forward[policy.ForwardRemote] = true
	case strings.Contains(ch, "auth-agent"):
		sr.forward[policy.ForwardAgent] = true
	case strings.Contains(ch, "x11"):
		sr.forward[policy.ForwardX11] = true
	}
	env := str(f, "env")
	if l.opt.Refused {
		env += "," + str(f, "env_refused")
	}
	for _, e := range strings.Split(env, ",") {
		if e != "" {
			sr.env[e] = true
		}
	}
}

func (l *learner) cred(name string, r audit.Record) *credRule {
	c := l.creds[name]
	if c == nil {
		c = &credRule{name: name, methods: map[string]bool{}, origin: origin{}}
		l.creds[name] = c
	}
	c.origin.add(r)
	return c
}

func (c *credRule) set(fn func(*credRule)) { fn(c) }

func (l *learner) credUse(r audit.Record) {
	f := r.Fields
	name := str(f, "credential")
	if name == "" {
		return
	}
	c := l.cred(name, r)
	c.from = str(f, "secret")
	if forge := str(f, "forge"); forge != "" {
		c.forge = forge
		return
	}
	host := ""
	if ns := flowNames(f); len(ns) > 0 {
		host = ns[0]
		if sni := strings.ToLower(str(f, "sni")); sni != "" {
			host = sni
		}
	}
	c.domain, c.header = host, str(f, "header")
	if fm := str(f, "format"); fm != "" {
		c.format = fm
	}
	if m := str(f, "method"); m != "" {
		c.methods[m] = true
	}
}

// collapse turns names into wildcards where the run reached at least
// MinSubdomains names directly under one parent (same protocol), and
// drops names a wildcard then covers with the same ports.
func (l *learner) collapse() []*netRule {
	type group struct {
		parent, proto string
		rules         []*netRule
	}
	groups := map[[2]string]*group{}
	var out []*netRule
	for _, nr := range l.nets {
		if nr.domain == "" {
			out = append(out, nr)
			continue
		}
		_, parent, ok := strings.Cut(nr.domain, ".")
		if !ok || !strings.Contains(parent, ".") {
			out = append(out, nr) // *.com is too broad for a profile
			continue
		}
		k := [2]string{parent, nr.proto}
		g := groups[k]
		if g == nil {
			g = &group{parent: parent, proto: nr.proto}
			groups[k] = g
		}
		g.rules = append(g.rules, nr)
	}
	for _, g := range groups {
		if len(g.rules) < MinSubdomains {
			out = append(out, g.rules...)
			continue
		}
		w := &netRule{netKey: netKey{domain: "*." + g.parent, proto: g.proto}, ports: map[uint16]bool{}, from: origin{}}
		for _, nr := range g.rules {
			for p := range nr.ports {
				w.ports[p] = true
			}
			w.from.merge(nr.from)
			w.names = append(w.names, nr.domain)
		}
		sort.Strings(w.names)
		out = append(out, w)
	}
	// A deeper name under a wildcard with all its ports is covered.
	var kept []*netRule
	for _, nr := range out {
		covered := false
		for _, w := range out {
			if w != nr && strings.HasPrefix(w.domain, "*.") && nr.domain != "" && !strings.HasPrefix(nr.domain, "*.") &&
				strings.HasSuffix(nr.domain, w.domain[1:]) && w.proto == nr.proto && subset(nr.ports, w.ports) {
				covered = true
				w.from.merge(nr.from)
				w.names = append(w.names, nr.domain)
			}
		}
		if !covered {
			kept = append(kept, nr)
		}
	}
	sort.Slice(kept, func(i, j int) bool {
		a, b := kept[i], kept[j]
		if (a.domain == "") != (b.domain == "") {
			return a.domain != ""
		}
		if a.domain != b.domain {
			return strings.TrimPrefix(a.domain, "*.") < strings.TrimPrefix(b.domain, "*.")
		}
		if a.cidr != b.cidr {
			return a.cidr < b.cidr
		}
		return a.proto < b.proto
	})
	return kept
}

func subset(a, b map[uint16]bool) bool {
	if b[0] {
		return true
	}
	for p := range a {
		if !b[p] {
			return false
		}
	}
	return true
}

// fileRule is one learned files rule.
type fileRule struct {
	path, access, why string
	from              origin
}

// fileRules: each rw mount readable (reads are not logged) and writable
// only where the run wrote; a directory the run created, or one in which
// it wrote MinFilesInDir paths or more, becomes DIR/**.
func (l *learner) fileRules() []fileRule {
	var out []fileRule
	mounts := make([]string, 0, len(l.mounts))
	for m := range l.mounts {
		mounts = append(mounts, m)
	}
	sort.Strings(mounts)
	for _, m := range mounts {
		if o, ok := l.overflow[m]; ok {
			o.merge(l.mounts[m])
			out = append(out, fileRule{path: globBase(m) + "/**", access: "rw", from: o,
				why: "the run wrote more paths than the gateway notes one by one, so the whole mount"})
			continue
		}
		out = append(out, fileRule{path: globBase(m) + "/**", access: "ro", from: l.mounts[m],
			why: "reads are not logged: the mount stays readable; writes only where the run wrote"})
	}
	// Directories first: created ones, then crowded ones.
	dirs := map[string]origin{}
	children := map[string][]*fileWrite{}
	for _, w := range l.writes {
		if _, ok := l.overflow[w.mount]; ok && w.mount != "" {
			continue
		}
		if w.dir {
			dirs[w.path] = origin{}
			dirs[w.path].merge(w.from)
		}
		parent := w.path[:strings.LastIndexByte(w.path, '/')]
		children[parent] = append(children[parent], w)
	}
	for d, ws := range children {
		if len(ws) >= MinFilesInDir && d != "" && !l.isMountOrAbove(d) {
			if dirs[d] == nil {
				dirs[d] = origin{}
			}
		}
	}
	// A directory under another collapsed one is the outer one's.
	var top []string
	for d := range dirs {
		top = append(top, d)
	}
	sort.Strings(top)
	under := func(p string, ds []string) string {
		for _, d := range ds {
			if p != d && strings.HasPrefix(p, d+"/") {
				return d
			}
		}
		return ""
	}
	var keep []string
	for _, d := range top {
		if under(d, top) == "" {
			keep = append(keep, d)
		}
	}
	for _, d := range top {
		if o := under(d, keep); o != "" {
			dirs[o].merge(dirs[d])
		}
	}
	for _, w := range l.writes {
		if d := under(w.path, keep); d != "" {
			dirs[d].merge(w.from)
		} else if slices.Contains(keep, w.path) {
			dirs[w.path].merge(w.from)
		}
	}
	for _, d := range keep {
		why := fmt.Sprintf("%d or more paths written in it", MinFilesInDir)
		for _, w := range l.writes {
			if w.path == d && w.dir {
				why = "the run created it"
			}
		}
		out = append(out, fileRule{path: globBase(d) + "/**", access: "rw", from: dirs[d], why: why})
	}
	var rest []string
	for p := range l.writes {
		if _, ok := l.overflow[l.writes[p].mount]; ok && l.writes[p].mount != "" {
			continue
		}
		if under(p, keep) == "" && !slices.Contains(keep, p) {
			rest = append(rest, p)
		}
	}
	sort.Strings(rest)
	for _, p := range rest {
		path := globPath(p)
		out = append(out, fileRule{path: path, access: "rw", from: l.writes[p].from})
	}
	return out
}

// globPath writes a path the run wrote as a files rule that matches it
// and as little else as a glob can: a character a rule cannot hold or
// that is special in one (control characters, * ? [ ] { } \, invalid
// UTF-8) becomes ?, which matches exactly one character. The paths are
// the guest's names, so they are never trusted to be plain.
func globPath(p string) string {
	var b strings.Builder
	for _, r := range p {
		switch {
		case r < 0x20 || r == 0x7f || r == utf8.RuneError || strings.ContainsRune("*?[]{}\\", r):
			b.WriteByte('?')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// globBase is globPath for the base of DIR/**.
func globBase(d string) string { return globPath(d) }

func (l *learner) isMountOrAbove(d string) bool {
	for m := range l.mounts {
		if m == d || strings.HasPrefix(m, d+"/") {
			return true
		}
	}
	return false
}

// yaml building

func scalar(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: v} }

func quoted(v string) *yaml.Node {
	n := scalar(v)
	if strings.HasPrefix(v, "*") {
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}

func mapping(kv ...any) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for i := 0; i+1 < len(kv); i += 2 {
		var v *yaml.Node
		switch x := kv[i+1].(type) {
		case *yaml.Node:
			if x == nil {
				continue
			}
			v = x
		case string:
			if x == "" {
				continue
			}
			v = quoted(x)
		}
		n.Content = append(n.Content, scalar(kv[i].(string)), v)
	}
	return n
}

func seq(items ...*yaml.Node) *yaml.Node { return &yaml.Node{Kind: yaml.SequenceNode, Content: items} }

func portSeq(ps map[uint16]bool) *yaml.Node {
	var list []int
	for p := range ps {
		list = append(list, int(p))
	}
	sort.Ints(list)
	n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	for _, p := range list {
		n.Content = append(n.Content, scalar(strconv.Itoa(p)))
	}
	return n
}

func flowStrings(ss []string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	for _, s := range ss {
		n.Content = append(n.Content, quoted(s))
	}
	return n
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (l *learner) result() (*Result, error) {
	res := &Result{Rules: map[string]int{}}
	root := &yaml.Node{Kind: yaml.MappingNode}
	add := func(k string, v *yaml.Node) { root.Content = append(root.Content, scalar(k), v) }
	if l.opt.Name != "" {
		add("name", scalar(l.opt.Name))
	}

	// network
	mode := scalar(string(policy.DefaultDeny))
	mode.LineComment = "only what the run reached"
	netm := mapping("mode", mode)
	var allow []*yaml.Node
	for _, nr := range l.collapse() {
		var n *yaml.Node
		if nr.ports[0] {
			n = mapping("domain", nr.domain, "proto", nr.proto)
		} else if nr.domain != "" {
			n = mapping("domain", nr.domain, "ports", portSeq(nr.ports), "proto", nr.proto)
		} else {
			n = mapping("cidr", nr.cidr, "ports", portSeq(nr.ports), "proto", nr.proto)
		}
		n.HeadComment = nr.from.String()
		if len(nr.names) > 0 {
			n.HeadComment = fmt.Sprintf("%d names under %s reached: %s; %s", len(nr.names), nr.domain[2:], strings.Join(nr.names, ", "), nr.from)
		}
		if nr.ports[0] {
			n.HeadComment += " (a refused lookup: the guest never connected, so any port)"
		} else if pf, err := netip.ParsePrefix(nr.cidr); err == nil && private(pf.Addr()) {
			n.HeadComment += " (a private address: no domain rule opens one)"
		} else if nr.domain == "" {
			n.HeadComment += " (no name: the address itself)"
		}
		allow = append(allow, n)
	}
	if len(allow) > 0 {
		netm.Content = append(netm.Content, scalar("allow"), seq(allow...))
	}
	if len(l.hostPorts) > 0 {
		ps := map[uint16]bool{}
		o := origin{}
		for p, po := range l.hostPorts {
			ps[p] = true
			o.merge(po)
		}
		k := scalar("host_ports")
		k.HeadComment = o.String()
		netm.Content = append(netm.Content, k, portSeq(ps))
	}
	res.Rules["network"] = len(allow) + len(l.hostPorts)
	add("network", netm)

	// files
	if frs := l.fileRules(); len(frs) > 0 {
		var rules []*yaml.Node
		for _, fr := range frs {
			n := mapping("path", fr.path, "access", fr.access)
			n.HeadComment = fr.from.String()
			if fr.why != "" {
				n.HeadComment = fr.why + "; " + n.HeadComment
			}
			rules = append(rules, n)
		}
		res.Rules["files"] = len(rules)
		add("files", mapping("rules", seq(rules...)))
	}

	// git
	if len(l.repos) > 0 {
		var repos []*yaml.Node
		for _, name := range sortedKeys(l.repos) {
			rr := l.repos[name]
			read := ""
			if rr.read {
				read = "allow"
			}
			var refs []*yaml.Node
			for _, ref := range sortedKeys(rr.refs) {
				f := rr.refs[ref]
				n := mapping("ref", f.ref, "push", verdict(f.push), "delete", verdict(f.del), "force_push", verdict(f.force))
				n.HeadComment = f.from.String()
				refs = append(refs, n)
			}
			n := mapping("repo", rr.repo, "read", read)
			if len(refs) > 0 {
				n.Content = append(n.Content, scalar("refs"), seq(refs...))
			}
			if len(rr.options) > 0 {
				n.Content = append(n.Content, scalar("push_options"), flowStrings(keys(rr.options)))
			}
			n.HeadComment = rr.from.String()
			repos = append(repos, n)
		}
		res.Rules["git"] = len(repos)
		add("git", mapping("repos", seq(repos...)))
	}

	// ssh
	if len(l.ssh) > 0 {
		var rules []*yaml.Node
		ks := make([]sshKey, 0, len(l.ssh))
		for k := range l.ssh {
			ks = append(ks, k)
		}
		sort.Slice(ks, func(i, j int) bool { return ks[i].host+"@"+ks[i].user < ks[j].host+"@"+ks[j].user })
		for _, k := range ks {
			sr := l.ssh[k]
			n := mapping("host", sr.host, "user", sr.user, "ports", portSeq(sr.ports), "sftp", verdict(sr.sftp))
			if len(sr.forward) > 0 {
				n.Content = append(n.Content, scalar("forward"), flowStrings(keys(sr.forward)))
			}
			if extra := extraEnv(sr.env); len(extra) > 0 {
				n.Content = append(n.Content, scalar("env"), flowStrings(append(slices.Clone(policy.DefaultSSHEnv), extra...)))
			}
			n.HeadComment = sr.from.String()
			rules = append(rules, n)
		}
		res.Rules["ssh"] = len(rules)
		add("ssh", mapping("allow", seq(rules...)))
	}

	// credentials
	if len(l.creds) > 0 {
		var cs []*yaml.Node
		for _, name := range sortedKeys(l.creds) {
			c := l.creds[name]
			if c.from == "" || c.domain == "" && c.forge == "" && c.sshHost == "" {
				res.Notes = append(res.Notes, "credential "+name+": the log does not say where it was bound; not learned")
				continue
			}
			n := mapping("name", c.name, "from", c.from)
			switch {
			case c.forge != "":
				n = mapping("name", c.name, "from", c.from, "forge", c.forge)
			case c.sshHost != "":
				n = mapping("name", c.name, "from", c.from, "ssh_host", c.sshHost)
			default:
				n = mapping("name", c.name, "from", c.from, "domain", c.domain, "header", c.header, "format", c.format)
				if len(c.methods) > 0 {
					n.Content = append(n.Content, scalar("methods"), flowStrings(keys(c.methods)))
				}
			}
			n.HeadComment = c.origin.String()
			cs = append(cs, n)
		}
		if len(cs) > 0 {
			res.Rules["credentials"] = len(cs)
			add("credentials", seq(cs...))
		}
	}

	head := "Learned by `smx profile learn`"
	if l.opt.Source != "" {
		head += " from " + l.opt.Source
	}
	head += ": the smallest profile that allows what the run did.\n" +
		"Each rule's comment names the log records (kind #seq) it comes from."
	if l.opt.Refused {
		head += fmt.Sprintf("\nIt also allows what the run was refused (--include-refused; %d refusal records read).", l.refusedIn)
	} else {
		head += "\nRefused actions are not learned: they stay refused."
	}
	root.HeadComment = head
	doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root}}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("learn: %w", err)
	}
	enc.Close()
	res.YAML = buf.Bytes()

	// The output must load, and allow again everything it was learned from.
	p, err := policy.Parse("learned.yaml", res.YAML, nil)
	if err != nil {
		return nil, fmt.Errorf("learn: the learned profile does not load (a bug): %w", err)
	}
	for _, rp := range l.replays {
		var d policy.Decision
		if rp.m != nil {
			d = p.DecideMounted(*rp.m, rp.req.Path, rp.req.Access)
		} else if rp.req.Kind == policy.KindSSH {
			d, _ = p.DecideSSH(rp.req)
		} else {
			d = p.Decide(rp.req)
		}
		if !d.Allow {
			res.Notes = append(res.Notes, fmt.Sprintf("%s #%d (%s) would still be refused: %s (%s)", rp.kind, rp.seq, rp.req, d.Reason, d.Rule))
		}
	}
	for _, why := range sortedKeys(l.skipped) {
		res.Notes = append(res.Notes, fmt.Sprintf("not learned: %d %s", l.skipped[why], why))
	}
	return res, nil
}

func extraEnv(env map[string]bool) []string {
	var out []string
	for _, e := range keys(env) {
		if e != "LANG" && !strings.HasPrefix(e, "LC_") {
			out = append(out, e)
		}
	}
	return out
}

func verdict(b bool) string {
	if b {
		return "allow"
	}
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
