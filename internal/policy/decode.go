package policy

import (
	"fmt"
	"net/netip"
	"net/textproto"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/smx-dev/smx/internal/cache"
	"github.com/smx-dev/smx/internal/errdefs"
)

// maxProfileSize bounds what Parse reads; real profiles are a few KiB.
const maxProfileSize = 1 << 20

// layer is what one file says, before `extends:` is applied.
type layer struct {
	name, extends string
	extendsPos    Pos
	network       Network // Mode "" when the file does not set it
	files         Files
	git           Git
	ssh           SSH // CertTTL 0 when the file does not set it
	credentials   []Credential
	log           Log
	ask           AskSettings // zero when the file does not set it
}

// decoder walks a yaml.Node tree, collecting every problem with its position
// rather than stopping at the first.
type decoder struct {
	file   string
	frozen bool // a sandbox's frozen copy: rule comments give the original positions (FrozenYAML)
	errs   []error
	syntax bool // the YAML itself did not parse: nothing else to check
}

func (d *decoder) pos(n *yaml.Node) Pos { return Pos{File: d.file, Line: n.Line, Col: n.Column} }

func (d *decoder) errorf(n *yaml.Node, format string, args ...any) {
	d.errs = append(d.errs, &ValidationError{File: d.file, Line: n.Line, Col: n.Column, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) errorAt(p Pos, format string, args ...any) {
	d.errs = append(d.errs, &ValidationError{File: p.File, Line: p.Line, Col: p.Col, Msg: fmt.Sprintf(format, args...)})
}

var yamlLineRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^yaml: line (\d+): (.*)$`) })

// yamlError turns a syntax error from the YAML library into a
// ValidationError; the library reports lines but not columns.
func (d *decoder) yamlError(err error) {
	ve := &ValidationError{File: d.file, Line: 1, Col: 1, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	if m := yamlLineRE().FindStringSubmatch(err.Error()); m != nil {
		ve.Line, _ = strconv.Atoi(m[1])
		ve.Msg = m[2]
	}
	if strings.Contains(ve.Msg, "alphabetic or numeric character") || strings.Contains(ve.Msg, "unknown anchor") {
		ve.Msg += ` (a value starting with "*" must be quoted: "*.example.com")`
	}
	d.errs = append(d.errs, ve)
}

func (d *decoder) decodeFile(data []byte) *layer {
	l := &layer{}
	if len(data) > maxProfileSize {
		d.errs = append(d.errs, &ValidationError{File: d.file, Line: 1, Col: 1, Msg: "profile is larger than 1 MiB"})
		d.syntax = true
		return l
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		d.yamlError(err)
		d.syntax = true
		return l
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return l // an empty file is an empty profile: default deny everywhere
	}
	if !d.noAliases(doc.Content[0]) {
		d.syntax = true
		return l
	}
	root := doc.Content[0]
	if isNull(root) {
		return l
	}
	f := d.fields(root, "profile", "name", "extends", "network", "files", "git", "ssh", "credentials", "log", "ask")
	if n := f["name"]; n != nil {
		if s, ok := d.str(n, "name"); ok {
			if !validName(s) {
				d.errorf(n, "name %q: use letters, digits, '.', '_' and '-'", s)
			}
			l.name = s
		}
	}
	if n := f["extends"]; n != nil {
		if s, ok := d.str(n, "extends"); ok {
			if s == "" {
				d.errorf(n, "extends is empty: name a built-in profile (%s) or a file", strings.Join(BuiltinNames(), ", "))
			}
			l.extends, l.extendsPos = s, d.pos(n)
		}
	}
	if n := f["network"]; n != nil {
		d.network(n, l)
	}
	if n := f["files"]; n != nil {
		d.files(n, l)
	}
	if n := f["git"]; n != nil {
		d.git(n, l)
	}
	if n := f["ssh"]; n != nil {
		d.ssh(n, l)
	}
	if n := f["log"]; n != nil {
		d.log(n, l)
	}
	if n := f["ask"]; n != nil {
		d.askSettings(n, l)
	}
	if n := f["credentials"]; n != nil {
		for i, c := range d.seq(n, "credentials") {
			if cr, ok := d.credential(c, fmt.Sprintf("credentials[%d]", i)); ok {
				l.credentials = append(l.credentials, cr)
			}
		}
	}
	return l
}

var validName = matcher(`^[A-Za-z0-9][A-Za-z0-9._-]*$`, 1, 64)

// matcher returns a check that s has min to max bytes and matches
// pattern, which is compiled on first use. The length is checked apart:
// a bounded repeat ({0,63}) compiles to a copy per count, which every smx
// process would pay for when it first reads a profile.
func matcher(pattern string, min, max int) func(s string) bool {
	re := sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(pattern) })
	return func(s string) bool { return len(s) >= min && len(s) <= max && re().MatchString(s) }
}

// noAliases rejects YAML aliases: they make positions ambiguous and allow
// exponential documents.
func (d *decoder) noAliases(n *yaml.Node) bool {
	if n.Kind == yaml.AliasNode {
		d.errorf(n, "YAML aliases are not supported")
		return false
	}
	ok := true
	for _, c := range n.Content {
		ok = d.noAliases(c) && ok
	}
	return ok
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

// fields checks that n is a mapping whose keys are all in known, without
// duplicates, and returns the value nodes by key.
func (d *decoder) fields(n *yaml.Node, what string, known ...string) map[string]*yaml.Node {
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	if isNull(n) {
		return out
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "%s: want a mapping with keys %s", what, strings.Join(known, ", "))
		return out
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, "%s: keys must be plain words", what)
			continue
		}
		found := false
		for _, kn := range known {
			if k.Value == kn {
				found = true
				break
			}
		}
		switch {
		case !found:
			d.errorf(k, "unknown key %q in %s (known: %s)", k.Value, what, strings.Join(known, ", "))
		case out[k.Value] != nil:
			d.errorf(k, "duplicate key %q in %s", k.Value, what)
		default:
			out[k.Value] = v
		}
	}
	return out
}

func (d *decoder) seq(n *yaml.Node, what string) []*yaml.Node {
	if n == nil || isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "%s: want a list", what)
		return nil
	}
	return n.Content
}

func (d *decoder) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.errorf(n, "%s: want a single value", what)
		return "", false
	}
	return n.Value, true
}

func (d *decoder) port(n *yaml.Node, what string) (uint16, bool) {
	s, ok := d.str(n, what)
	if !ok {
		return 0, false
	}
	p, err := parsePort(s)
	if err != nil {
		d.errorf(n, "%s: %v", what, err)
		return 0, false
	}
	return p, true
}

// id reads an optional uid or gid (absent: 0).
func (d *decoder) id(n *yaml.Node, what string) (uint32, bool) {
	if n == nil {
		return 0, true
	}
	s, ok := d.str(n, what)
	if !ok {
		return 0, false
	}
	v, err := parseID(s)
	if err != nil {
		d.errorf(n, "%s: %v", what, err)
		return 0, false
	}
	return v, true
}

// parseID reads a uid or gid: a decimal number below 2^32-1 (which is
// "no id" to the kernel).
func parseID(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil || v == 1<<32-1 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("bad id %q: want a number from 0 to 4294967294", s)
	}
	return uint32(v), nil
}

func parsePort(s string) (uint16, error) {
	v, err := strconv.ParseUint(s, 10, 16)
	if err != nil || v == 0 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("bad port %q: want a number from 1 to 65535", s)
	}
	return uint16(v), nil
}

// ports reads `ports: 443`, `ports: [80, 443, "8000-8100"]`.
func (d *decoder) ports(n *yaml.Node, what string) ([]PortRange, bool) {
	items := []*yaml.Node{n}
	if n.Kind == yaml.SequenceNode {
		items = n.Content
		if len(items) == 0 {
			d.errorf(n, "%s: empty list; leave ports out to mean any port", what)
			return nil, false
		}
	}
	var out []PortRange
	ok := true
	for _, it := range items {
		s, good := d.str(it, what)
		if !good {
			ok = false
			continue
		}
		lo, hi, isRange := strings.Cut(s, "-")
		a, err := parsePort(strings.TrimSpace(lo))
		b := a
		if err == nil && isRange {
			b, err = parsePort(strings.TrimSpace(hi))
			if err == nil && b < a {
				err = fmt.Errorf("bad port range %q: low end above high end", s)
			}
		}
		if err != nil {
			d.errorf(it, "%s: %v", what, err)
			ok = false
			continue
		}
		out = append(out, PortRange{a, b})
	}
	return out, ok
}

func (d *decoder) verdict(n *yaml.Node, what string) Verdict {
	if n == nil {
		return Unset
	}
	s, ok := d.str(n, what)
	if !ok {
		return Unset
	}
	switch s {
	case "allow", "true":
		return Allow
	case "deny", "false":
		return Deny
	case "ask":
		return Ask
	}
	d.errorf(n, "%s: %q is not allow or deny (or ask, for push, delete and force_push)", what, s)
	return Unset
}

// verdictNoAsk is verdict for settings that cannot be asked (a clone's
// read, sftp): nothing there can be held until the host user answers.
func (d *decoder) verdictNoAsk(n *yaml.Node, what string) Verdict {
	v := d.verdict(n, what)
	if v == Ask {
		d.errorf(n, "%s: ask applies to push, delete and force_push; say allow or deny", what)
		return Unset
	}
	return v
}

// askSettings reads the `ask:` section.
func (d *decoder) askSettings(n *yaml.Node, l *layer) {
	f := d.fields(n, "ask", "timeout", "max")
	l.ask.Pos = d.pos(n)
	if tn := f["timeout"]; tn != nil {
		if s, ok := d.str(tn, "ask.timeout"); ok {
			t, err := time.ParseDuration(s)
			switch {
			case err != nil:
				d.errorf(tn, "ask.timeout: %q is not a duration such as 60s or 5m", s)
			case t < time.Second || t > time.Hour:
				d.errorf(tn, "ask.timeout: %s is outside 1s..1h", t)
			default:
				l.ask.Timeout = t
			}
		}
	}
	if mn := f["max"]; mn != nil {
		if s, ok := d.str(mn, "ask.max"); ok {
			m, err := strconv.Atoi(s)
			if err != nil || m < 1 || m > 256 {
				d.errorf(mn, "ask.max: %q is not a number in 1..256", s)
			} else {
				l.ask.Max = m
			}
		}
	}
}

func (d *decoder) network(n *yaml.Node, l *layer) {
	f := d.fields(n, "network", "mode", "allow", "deny", "ask", "host_ports")
	if m := f["mode"]; m != nil {
		if s, ok := d.str(m, "network.mode"); ok {
			switch Mode(s) {
			case AllowAll, DenyAll, DefaultDeny, AskMode:
				l.network.Mode, l.network.ModePos = Mode(s), d.srcPos(m, m.LineComment)
			default:
				d.errorf(m, "network.mode: %q is not one of allow-all, deny-all, default-deny, ask", s)
			}
		}
	}
	for i, r := range d.seq(f["allow"], "network.allow") {
		if rule, ok := d.netRule(r, fmt.Sprintf("network.allow[%d]", i), true); ok {
			l.network.Allow = append(l.network.Allow, rule)
		}
	}
	for i, r := range d.seq(f["deny"], "network.deny") {
		if rule, ok := d.netRule(r, fmt.Sprintf("network.deny[%d]", i), false); ok {
			l.network.Deny = append(l.network.Deny, rule)
		}
	}
	// An ask rule may open what an allow rule may: it is validated as one.
	for i, r := range d.seq(f["ask"], "network.ask") {
		if rule, ok := d.netRule(r, fmt.Sprintf("network.ask[%d]", i), true); ok {
			l.network.Ask = append(l.network.Ask, rule)
		}
	}
	if hp := f["host_ports"]; hp != nil {
		items := []*yaml.Node{hp}
		if hp.Kind == yaml.SequenceNode {
			items = hp.Content
		}
		for _, it := range items {
			if p, ok := d.port(it, "network.host_ports"); ok {
				l.network.HostPorts = append(l.network.HostPorts, HostPort{Port: p, Pos: d.pos(it)})
			}
		}
	}
}

func (d *decoder) netRule(n *yaml.Node, where string, allow bool) (NetRule, bool) {
	r := NetRule{Where: where}
	r.Pos, r.Where = d.rulePos(n, where)
	f := d.fields(n, where, "domain", "cidr", "ports", "proto")
	dn, cn := f["domain"], f["cidr"]
	switch {
	case dn == nil && cn == nil:
		d.errorf(n, "%s: needs a domain or a cidr", where)
		return r, false
	case dn != nil && cn != nil:
		d.errorf(cn, "%s: a rule has a domain or a cidr, not both; write two rules", where)
		return r, false
	}
	ok := true
	if dn != nil {
		s, good := d.str(dn, where+".domain")
		if !good {
			return r, false
		}
		dom, err := normDomainPattern(s)
		if err != nil {
			d.errorf(dn, "%s: domain %q: %v", where, s, err)
			return r, false
		}
		if dom == hostInternal || strings.HasSuffix(hostInternal, strings.TrimPrefix(dom, "*")) {
			d.errorf(dn, "%s: domain %q names the host; expose host services with network.host_ports", where, s)
			return r, false
		}
		if allow && closedName(strings.TrimPrefix(dom, "*.")) {
			d.errorf(dn, "%s: domain %q is always closed and cannot be opened by a profile", where, s)
			return r, false
		}
		r.Domain = dom
	}
	if cn != nil {
		s, good := d.str(cn, where+".cidr")
		if !good {
			return r, false
		}
		pfx, err := parseCIDR(s)
		if err != nil {
			d.errorf(cn, "%s: %v", where, err)
			return r, false
		}
		if allow {
			if name := closedOverlap(pfx); name != "" {
				d.errorf(cn, "%s: cidr %s overlaps %s, which is always closed and cannot be opened by a profile", where, s, name)
				return r, false
			}
		}
		r.CIDR = pfx
	}
	if pn := f["ports"]; pn != nil {
		r.Ports, ok = d.ports(pn, where+".ports")
	}
	if pn := f["proto"]; pn != nil {
		if s, good := d.str(pn, where+".proto"); good {
			switch s {
			case "tcp", "udp":
				r.Proto = s
			default:
				d.errorf(pn, "%s.proto: %q is not tcp or udp", where, s)
				ok = false
			}
		}
	}
	return r, ok
}

// parseCIDR accepts only canonical network prefixes in their plain form.
func parseCIDR(s string) (netip.Prefix, error) {
	pfx, err := netip.ParsePrefix(s)
	if err != nil {
		if a, aerr := netip.ParseAddr(s); aerr == nil {
			return netip.Prefix{}, fmt.Errorf("cidr %q has no prefix length; write %s/%d", s, s, a.BitLen())
		}
		return netip.Prefix{}, fmt.Errorf("bad cidr %q: want a network such as 10.0.0.0/8 or fd12::/16", s)
	}
	if pfx.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("cidr %q is IPv4-mapped IPv6; write it as IPv4", s)
	}
	if pfx.Masked() != pfx {
		return netip.Prefix{}, fmt.Errorf("cidr %q has host bits set; did you mean %s?", s, pfx.Masked())
	}
	return pfx, nil
}

func (d *decoder) files(n *yaml.Node, l *layer) {
	f := d.fields(n, "files", "mounts", "rules", "caches")
	for i, c := range d.seq(f["caches"], "files.caches") {
		where := fmt.Sprintf("files.caches[%d]", i)
		v, ok := d.str(c, where)
		if !ok {
			continue
		}
		// Checked as the guest user root's; the sandbox's user's home
		// replaces ~ when it is created.
		if _, err := cache.Parse(v, "/root"); err != nil {
			d.errorf(c, "%s: %v", where, strings.TrimSuffix(err.Error(), ": "+errdefs.ErrInvalid.Error()))
			continue
		}
		l.files.Caches = append(l.files.Caches, Cache{Spec: v, Pos: d.pos(c)})
	}
	for i, m := range d.seq(f["mounts"], "files.mounts") {
		where := fmt.Sprintf("files.mounts[%d]", i)
		var host, guest string
		var uid, gid uint32
		if m.Kind == yaml.ScalarNode && !isNull(m) {
			// HOST:GUEST, or HOST:GUEST:uid=N,gid=N as -v spells it.
			v := m.Value
			if i := strings.LastIndexByte(v, ':'); i >= 0 && strings.Contains(v[i+1:], "=") {
				ok := true
				for o := range strings.SplitSeq(v[i+1:], ",") {
					k, val, _ := strings.Cut(o, "=")
					var id uint32
					var err error
					if id, err = parseID(val); err != nil || k != "uid" && k != "gid" {
						d.errorf(m, "%s: %q: unknown option %q: want uid=N or gid=N", where, v, o)
						ok = false
						break
					}
					if k == "uid" {
						uid = id
					} else {
						gid = id
					}
				}
				if !ok {
					continue
				}
				v = v[:i]
			}
			i := strings.LastIndexByte(v, ':')
			if i < 0 {
				d.errorf(m, "%s: %q: want HOST:GUEST", where, m.Value)
				continue
			}
			host, guest = v[:i], v[i+1:]
		} else {
			mf := d.fields(m, where, "host", "guest", "uid", "gid")
			hn, gn := mf["host"], mf["guest"]
			if hn == nil || gn == nil {
				d.errorf(m, "%s: needs host and guest", where)
				continue
			}
			var ok1, ok2 bool
			host, ok1 = d.str(hn, where+".host")
			guest, ok2 = d.str(gn, where+".guest")
			if !ok1 || !ok2 {
				continue
			}
			if uid, ok1 = d.id(mf["uid"], where+".uid"); !ok1 {
				continue
			}
			if gid, ok1 = d.id(mf["gid"], where+".gid"); !ok1 {
				continue
			}
		}
		if !filepath.IsAbs(host) || filepath.Clean(host) != host {
			d.errorf(m, "%s: host path %q must be absolute and clean", where, host)
			continue
		}
		if !path.IsAbs(guest) || path.Clean(guest) != guest || guest == "/" {
			d.errorf(m, "%s: guest path %q must be absolute, clean and not /", where, guest)
			continue
		}
		l.files.Mounts = append(l.files.Mounts, Mount{Host: host, Guest: guest, UID: uid, GID: gid, Pos: d.pos(m)})
	}
	for i, r := range d.seq(f["rules"], "files.rules") {
		where := fmt.Sprintf("files.rules[%d]", i)
		rf := d.fields(r, where, "path", "access")
		pn, an := rf["path"], rf["access"]
		if pn == nil || an == nil {
			d.errorf(r, "%s: needs path and access", where)
			continue
		}
		p, ok1 := d.str(pn, where+".path")
		a, ok2 := d.str(an, where+".access")
		if !ok1 || !ok2 {
			continue
		}
		if err := checkGlob(p, true); err != nil {
			d.errorf(pn, "%s: path %q: %v", where, p, err)
			continue
		}
		switch Access(a) {
		case ReadWrite, ReadOnly, NoAccess, AskAccess, AskWrite:
		default:
			d.errorf(an, "%s: access %q is not rw, ro or deny (or ask, ask-write: held for the host user's answer)", where, a)
			continue
		}
		fr := FileRule{Path: p, Access: Access(a)}
		fr.Pos, fr.Where = d.rulePos(r, where)
		l.files.Rules = append(l.files.Rules, fr)
	}
}

func (d *decoder) git(n *yaml.Node, l *layer) {
	f := d.fields(n, "git", "repos")
	for i, r := range d.seq(f["repos"], "git.repos") {
		where := fmt.Sprintf("git.repos[%d]", i)
		rf := d.fields(r, where, "repo", "read", "push", "delete", "force_push", "refs", "push_options")
		rn := rf["repo"]
		if rn == nil {
			d.errorf(r, "%s: needs repo (e.g. github.com/acme/*)", where)
			continue
		}
		repo, ok := d.str(rn, where+".repo")
		if !ok {
			continue
		}
		repo = strings.ToLower(repo)
		if err := checkGlob(repo, false); err != nil {
			d.errorf(rn, "%s: repo %q: %v", where, repo, err)
			continue
		}
		rr := RepoRule{Repo: repo,
			Read:      d.verdictNoAsk(rf["read"], where+".read"),
			Push:      d.verdict(rf["push"], where+".push"),
			Delete:    d.verdict(rf["delete"], where+".delete"),
			ForcePush: d.verdict(rf["force_push"], where+".force_push"),
		}
		rr.Pos, rr.Where = d.rulePos(r, where)
		for _, on := range d.seq(rf["push_options"], where+".push_options") {
			if s, ok := d.str(on, where+".push_options"); ok {
				if !validOptionGlob(s) {
					d.errorf(on, "%s.push_options: %q: name an option as git push -o takes it, e.g. ci.skip (letters, digits, '.', '_', '-' and the glob *)", where, s)
					continue
				}
				rr.PushOptions = append(rr.PushOptions, s)
			}
		}
		for j, fn := range d.seq(rf["refs"], where+".refs") {
			fw := fmt.Sprintf("%s.refs[%d]", where, j)
			ff := d.fields(fn, fw, "ref", "push", "delete", "force_push")
			refn := ff["ref"]
			if refn == nil {
				d.errorf(fn, "%s: needs ref (e.g. refs/heads/main)", fw)
				continue
			}
			ref, ok := d.str(refn, fw+".ref")
			if !ok {
				continue
			}
			if !strings.HasPrefix(ref, "refs/") {
				d.errorf(refn, "%s: ref %q: write the full ref name, e.g. refs/heads/%s or refs/tags/*", fw, ref, ref)
				continue
			}
			if err := checkGlob(ref, false); err != nil {
				d.errorf(refn, "%s: ref %q: %v", fw, ref, err)
				continue
			}
			fr := RefRule{Ref: ref,
				Push:      d.verdict(ff["push"], fw+".push"),
				Delete:    d.verdict(ff["delete"], fw+".delete"),
				ForcePush: d.verdict(ff["force_push"], fw+".force_push"),
			}
			fr.Pos, fr.Where = d.rulePos(fn, fw)
			if fr.Push == Unset && fr.Delete == Unset && fr.ForcePush == Unset {
				d.errorf(fn, "%s: sets none of push, delete, force_push", fw)
				continue
			}
			rr.Refs = append(rr.Refs, fr)
		}
		l.git.Repos = append(l.git.Repos, rr)
	}
}

func (d *decoder) ssh(n *yaml.Node, l *layer) {
	f := d.fields(n, "ssh", "cert_ttl", "allow", "deny")
	if tn := f["cert_ttl"]; tn != nil {
		if s, ok := d.str(tn, "ssh.cert_ttl"); ok {
			ttl, err := time.ParseDuration(s)
			switch {
			case err != nil:
				d.errorf(tn, "ssh.cert_ttl: %q is not a duration such as 5m or 1h", s)
			case ttl < time.Minute || ttl > 24*time.Hour:
				d.errorf(tn, "ssh.cert_ttl: %s is outside 1m..24h", ttl)
			default:
				l.ssh.CertTTL = ttl
			}
		}
	}
	for _, list := range []struct {
		key string
		dst *[]SSHRule
	}{{"allow", &l.ssh.Allow}, {"deny", &l.ssh.Deny}} {
		for i, r := range d.seq(f[list.key], "ssh."+list.key) {
			where := fmt.Sprintf("ssh.%s[%d]", list.key, i)
			rf := d.fields(r, where, "host", "user", "ports", "sftp", "forward", "env", "host_key", "git_root", "ask")
			hn := rf["host"]
			if hn == nil {
				d.errorf(r, "%s: needs host", where)
				continue
			}
			host, ok := d.str(hn, where+".host")
			if !ok {
				continue
			}
			host = strings.TrimSuffix(strings.ToLower(host), ".")
			if err := checkHostGlob(host); err != nil {
				d.errorf(hn, "%s: host %q: %v", where, host, err)
				continue
			}
			sr := SSHRule{Host: host, Ports: []PortRange{{22, 22}}}
			sr.Pos, sr.Where = d.rulePos(r, where)
			if un := rf["user"]; un != nil {
				u, ok := d.str(un, where+".user")
				if !ok {
					continue
				}
				if !validUserGlob(u) {
					d.errorf(un, "%s: user %q: use letters, digits, '.', '_', '-' and the globs * ?", where, u)
					continue
				}
				if u != "*" {
					sr.User = u
				}
			}
			if pn := rf["ports"]; pn != nil {
				ps, ok := d.ports(pn, where+".ports")
				if !ok {
					continue
				}
				sr.Ports = ps
			}
			if !d.sshOptions(rf, where, list.key == "allow", &sr) {
				continue
			}
			if sr.GitRoot != "" && (sr.User == "" || strings.ContainsAny(sr.User, "*?")) {
				// One home: ~ and relative paths resolve in the login user's.
				d.errorf(rf["git_root"], "%s: git_root is one user's home; name that user (user: git)", where)
				continue
			}
			*list.dst = append(*list.dst, sr)
		}
	}
}

// sshOptions reads what an allow rule lets a session do besides exec and
// shell; a deny rule denies the whole connection, so it takes none.
func (d *decoder) sshOptions(rf map[string]*yaml.Node, where string, allowRule bool, sr *SSHRule) bool {
	ok := true
	for _, k := range []string{"sftp", "forward", "env", "host_key", "git_root"} {
		if n := rf[k]; n != nil && !allowRule {
			d.errorf(n, "%s: %s applies to allow rules only (a deny rule refuses the whole connection)", where, k)
			ok = false
		}
	}
	if !ok {
		return false
	}
	sr.SFTP = d.verdictNoAsk(rf["sftp"], where+".sftp")
	if an := rf["ask"]; an != nil {
		if !allowRule {
			d.errorf(an, "%s: ask applies to allow rules only", where)
			return false
		}
		sr.Ask = d.verdictNoAsk(an, where+".ask") == Allow
	}
	for _, fn := range d.seq(rf["forward"], where+".forward") {
		s, good := d.str(fn, where+".forward")
		if !good {
			return false
		}
		switch s {
		case ForwardLocal, ForwardRemote, ForwardAgent, ForwardX11:
			if !slices.Contains(sr.Forward, s) {
				sr.Forward = append(sr.Forward, s)
			}
		default:
			d.errorf(fn, "%s.forward: %q: want local, remote, agent or x11", where, s)
			return false
		}
	}
	if n := rf["env"]; n != nil {
		sr.Env = []string{}
		for _, en := range d.seq(n, where+".env") {
			s, good := d.str(en, where+".env")
			if !good {
				return false
			}
			if !validEnvGlob(s) {
				d.errorf(en, "%s.env: %q: use letters, digits, '_' and the globs * ?", where, s)
				return false
			}
			sr.Env = append(sr.Env, s)
		}
	}
	if n := rf["host_key"]; n != nil {
		s, good := d.str(n, where+".host_key")
		if !good {
			return false
		}
		if !validHostKey(s) {
			d.errorf(n, "%s.host_key: %q: want a SHA256 fingerprint as ssh-keygen -lf prints it (SHA256:...)", where, s)
			return false
		}
		sr.HostKey = s
	}
	if n := rf["git_root"]; n != nil {
		s, good := d.str(n, where+".git_root")
		if !good {
			return false
		}
		if !strings.HasPrefix(s, "/") || s == "/" || path.Clean(s) != s || strings.ContainsAny(s, "%\\'\"~") || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
			d.errorf(n, "%s.git_root: %q: want the Git user's home directory on the server as a clean absolute path, e.g. /home/git", where, s)
			return false
		}
		sr.GitRoot = s
	}
	return true
}

var (
	validEnvGlob    = matcher(`^[A-Za-z_*?][A-Za-z0-9_*?]*$`, 1, 64)
	validHostKey    = matcher(`^SHA256:[A-Za-z0-9+/]*$`, 50, 50)
	validUserGlob   = matcher(`^[A-Za-z0-9._*?-]*$`, 1, 64)
	validSecretName = matcher(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`, 1, 128)
	validMethod     = matcher(`^[A-Za-z]*$`, 1, 16)
	validHeader     = matcher("^[A-Za-z0-9!#$%&'*+.^_`|~-]*$", 1, 64)
	validOptionGlob = matcher(`^[A-Za-z0-9_*][A-Za-z0-9._*-]*$`, 1, 64)
)

// budget reads a credential's `budget:` mapping: tokens and/or requests
// (positive integers; underscores allowed, 2_000_000) and per.
func (d *decoder) budget(n *yaml.Node, where string) (*Budget, bool) {
	f := d.fields(n, where, "tokens", "requests", "per", "ask")
	if n.Kind != yaml.MappingNode {
		return nil, false
	}
	b := &Budget{Per: BudgetPerSandbox, Pos: d.pos(n)}
	ok := true
	count := func(key string) int64 {
		v := f[key]
		if v == nil {
			return 0
		}
		s, sok := d.str(v, where+"."+key)
		if !sok {
			ok = false
			return 0
		}
		x, err := strconv.ParseInt(strings.ReplaceAll(s, "_", ""), 10, 64)
		if err != nil || x <= 0 {
			d.errorf(v, "%s.%s: %q: want a positive whole number, e.g. %s", where, key, s, map[string]string{"tokens": "2000000", "requests": "500"}[key])
			ok = false
			return 0
		}
		return x
	}
	b.Tokens, b.Requests = count("tokens"), count("requests")
	if v := f["per"]; v != nil {
		if s, sok := d.str(v, where+".per"); !sok {
			ok = false
		} else if s != BudgetPerSandbox && s != BudgetPerDay {
			d.errorf(v, "%s.per: %q: want sandbox (the sandbox's whole life) or day (one UTC day)", where, s)
			ok = false
		} else {
			b.Per = s
		}
	}
	if an := f["ask"]; an != nil {
		b.Ask = d.verdictNoAsk(an, where+".ask") == Allow
	}
	if ok && b.Tokens == 0 && b.Requests == 0 {
		d.errorf(n, "%s: give tokens, requests or both (e.g. {tokens: 2000000, requests: 500, per: day})", where)
		ok = false
	}
	return b, ok
}

func (d *decoder) credential(n *yaml.Node, where string) (Credential, bool) {
	c := Credential{Pos: d.srcPos(n, n.HeadComment)}
	f := d.fields(n, where, "name", "from", "domain", "header", "format", "forge", "ssh_host", "methods", "paths", "headers", "deny_paths", "budget", "ask")
	get := func(key string) string {
		if v := f[key]; v != nil {
			s, _ := d.str(v, where+"."+key)
			return s
		}
		return ""
	}
	c.Name, c.From = get("name"), get("from")
	c.Domain, c.Header, c.Format = get("domain"), get("header"), get("format")
	c.Forge, c.SSHHost = get("forge"), get("ssh_host")
	if an := f["ask"]; an != nil {
		c.Ask = d.verdictNoAsk(an, where+".ask") == Allow
		if c.Ask && c.Domain == "" {
			// The network broker holds a request; the Git and SSH
			// gateways do not ask about their credentials.
			d.errorf(an, "%s: ask applies to domain bindings (the broker holds the request); for a forge or an ssh_host, ask on the git or ssh rule", where)
		}
	}
	ok := true
	bad := func(key, format string, args ...any) {
		at := n
		if f[key] != nil {
			at = f[key]
		}
		d.errorf(at, where+": "+format, args...)
		ok = false
	}
	if !validName(c.Name) {
		bad("name", "name %q: use letters, digits, '.', '_' and '-'", c.Name)
	}
	if c.From == SSHAgentSecret {
		if f["ssh_host"] == nil {
			bad("from", "from %q is only for ssh_host credentials", c.From)
		}
	} else if !validSecretName(c.From) {
		bad("from", "from %q: name the secret in the host-side store", c.From)
	}
	bound := 0
	for _, k := range []string{"domain", "forge", "ssh_host"} {
		if f[k] != nil {
			bound++
		}
	}
	if bound != 1 {
		bad("", "credential %q must be bound to exactly one of domain (with header), forge or ssh_host; a secret is never bound to anywhere", c.Name)
		return c, false
	}
	anywhere := func(s string) bool { return strings.Trim(s, "*?.") == "" }
	switch {
	case f["domain"] != nil:
		if anywhere(c.Domain) {
			bad("domain", "domain %q: a secret is never bound to anywhere; name the domain it is for", c.Domain)
			break
		}
		dom, err := normDomainPattern(c.Domain)
		if err != nil {
			bad("domain", "domain %q: %v", c.Domain, err)
			break
		}
		c.Domain = dom
		if !validHeader(c.Header) {
			bad("header", "header %q: a domain binding needs the HTTP header to set, e.g. Authorization", c.Header)
		}
		if c.Format == "" {
			c.Format = "{}"
		} else if strings.Count(c.Format, "{}") != 1 || strings.ContainsAny(c.Format, "\r\n") {
			bad("format", "format %q must contain {} exactly once (e.g. \"Bearer {}\") and no line breaks", c.Format)
		}
	case f["forge"] != nil:
		c.Forge = strings.TrimSuffix(strings.ToLower(c.Forge), ".")
		if anywhere(c.Forge) {
			bad("forge", "forge %q: a secret is never bound to anywhere; name the forge host, e.g. github.com", c.Forge)
		} else if msg := checkHostname(c.Forge); msg != "" {
			bad("forge", "forge %q: %s", c.Forge, msg)
		}
	default:
		c.SSHHost = strings.TrimSuffix(strings.ToLower(c.SSHHost), ".")
		if anywhere(c.SSHHost) {
			bad("ssh_host", "ssh_host %q: a secret is never bound to anywhere; name the host", c.SSHHost)
		} else if err := checkHostGlob(c.SSHHost); err != nil {
			bad("ssh_host", "ssh_host %q: %v", c.SSHHost, err)
		}
	}
	if f["domain"] == nil && (f["header"] != nil || f["format"] != nil) {
		bad("header", "header and format go with a domain binding")
	}
	for i, m := range d.seq(f["methods"], where+".methods") {
		if s, sok := d.str(m, fmt.Sprintf("%s.methods[%d]", where, i)); sok {
			if !validMethod(s) {
				d.errorf(m, "%s.methods[%d]: %q is not an HTTP method such as GET or POST", where, i, s)
				ok = false
				continue
			}
			c.Methods = append(c.Methods, strings.ToUpper(s))
		}
	}
	for i, pn := range d.seq(f["paths"], where+".paths") {
		if s, sok := d.str(pn, fmt.Sprintf("%s.paths[%d]", where, i)); sok {
			if err := checkGlob(s, true); err != nil {
				d.errorf(pn, "%s.paths[%d]: %q %v (e.g. /repos/acme/*/pulls)", where, i, s, err)
				ok = false
				continue
			}
			c.Paths = append(c.Paths, s)
		}
	}
	for i, pn := range d.seq(f["deny_paths"], where+".deny_paths") {
		if s, sok := d.str(pn, fmt.Sprintf("%s.deny_paths[%d]", where, i)); sok {
			if err := checkGlob(s, true); err != nil {
				d.errorf(pn, "%s.deny_paths[%d]: %q %v (e.g. /api/oauth/*/create_api_key)", where, i, s, err)
				ok = false
				continue
			}
			c.DenyPaths = append(c.DenyPaths, s)
		}
	}
	if f["deny_paths"] != nil && f["domain"] == nil {
		bad("deny_paths", "deny_paths refuses requests on a domain binding's host; it goes with domain")
	}
	if bn := f["budget"]; bn != nil && !isNull(bn) {
		if f["domain"] == nil {
			bad("budget", "budget counts model requests through the network gateway; it goes with domain")
		} else if b, bok := d.budget(bn, where+".budget"); bok {
			c.Budget = b
		} else {
			ok = false
		}
	}
	if hn := f["headers"]; hn != nil && !isNull(hn) {
		if hn.Kind != yaml.MappingNode {
			d.errorf(hn, "%s.headers: want a mapping of header name to value glob, e.g. Accept: \"application/vnd.github*\"", where)
			ok = false
		} else {
			seen := map[string]bool{}
			for i := 0; i+1 < len(hn.Content); i += 2 {
				k, v := hn.Content[i], hn.Content[i+1]
				val, vok := d.str(v, where+".headers."+k.Value)
				name := textproto.CanonicalMIMEHeaderKey(k.Value)
				switch {
				case k.Kind != yaml.ScalarNode || !validHeader(k.Value):
					d.errorf(k, "%s.headers: %q is not a header name", where, k.Value)
					ok = false
				case seen[name]:
					d.errorf(k, "%s.headers: %s given twice", where, name)
					ok = false
				case !vok:
					ok = false
				case strings.ContainsAny(val, "\r\n"):
					d.errorf(v, "%s.headers.%s: no line breaks", where, k.Value)
					ok = false
				default:
					seen[name] = true
					c.Headers = append(c.Headers, HeaderMatch{Name: name, Value: val})
				}
			}
			slices.SortFunc(c.Headers, func(a, b HeaderMatch) int { return strings.Compare(a.Name, b.Name) })
		}
	}
	if f["ssh_host"] != nil && (f["methods"] != nil || f["paths"] != nil || f["headers"] != nil) {
		bad("methods", "methods, paths and headers match HTTP requests; they go with a domain or forge binding")
	}
	return c, ok
}

// log decodes the `log:` section: redact patterns for what the audit log
// records of commands (see audit.Redactor).
func (d *decoder) log(n *yaml.Node, l *layer) {
	f := d.fields(n, "log", "redact")
	rn := f["redact"]
	if rn == nil {
		return
	}
	for i, p := range d.seq(rn, "log.redact") {
		where := fmt.Sprintf("log.redact[%d]", i)
		s, ok := d.str(p, where)
		if !ok {
			continue
		}
		re, err := regexp.Compile(s)
		switch {
		case s == "":
			d.errorf(p, "%s: empty pattern", where)
		case len(s) > 1024:
			d.errorf(p, "%s: pattern longer than 1024 characters", where)
		case err != nil:
			d.errorf(p, "%s: %v", where, err)
		case re.NumSubexp() > 1:
			d.errorf(p, "%s: at most one group (the part to redact); use (?:...) for the others", where)
		case re.MatchString(""):
			d.errorf(p, "%s: pattern %q matches the empty string", where, s)
		default:
			l.log.Redact = append(l.log.Redact, RedactRule{Pattern: s, Pos: d.pos(p)})
		}
	}
}

// The frozen copy of a profile (FrozenYAML) is canonical YAML whose rules
// carry comments "@ FILE:LINE:COL WHERE" naming where the user wrote them,
// so that decisions cite the user's file and line, not the copy. Only a
// frozen copy is read this way (LoadFrozen); in any other file such
// comments are just comments.
const srcMark = "@ "

// srcComment returns the position and rule name a frozen copy's comment
// gives, if it holds one.
func srcComment(comment string) (Pos, string, bool) {
	for _, line := range strings.Split(comment, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
		rest, ok := strings.CutPrefix(line, srcMark)
		if !ok {
			continue
		}
		loc, where, _ := strings.Cut(rest, " ")
		// FILE may itself contain colons: the last two fields are line and column.
		i := strings.LastIndexByte(loc, ':')
		if i < 0 {
			continue
		}
		j := strings.LastIndexByte(loc[:i], ':')
		if j <= 0 {
			continue
		}
		line, err1 := strconv.Atoi(loc[j+1 : i])
		col, err2 := strconv.Atoi(loc[i+1:])
		if err1 != nil || err2 != nil {
			continue
		}
		return Pos{File: loc[:j], Line: line, Col: col}, where, true
	}
	return Pos{}, "", false
}

// rulePos is where the rule at n was written: its own position, or in a
// frozen copy the original one.
func (d *decoder) rulePos(n *yaml.Node, where string) (Pos, string) {
	if d.frozen {
		if p, w, ok := srcComment(n.HeadComment); ok && w != "" {
			return p, w
		}
	}
	return d.pos(n), where
}

// srcPos is rulePos for a value without a rule name.
func (d *decoder) srcPos(n *yaml.Node, comment string) Pos {
	if d.frozen {
		if p, _, ok := srcComment(comment); ok {
			return p
		}
	}
	return d.pos(n)
}
