package policy

import (
	"slices"
	"strings"
)

// merge applies one file's layer on top of the profile it extends. Lists
// are appended (the base's rules first, with their own positions); mode and
// cert_ttl are replaced when the file sets them. A profile can only add
// rules to its base, never remove one: a deny in the base stays a deny.
func merge(p, base *Profile, l *layer) {
	if base != nil {
		p.Network = Network{
			Mode: base.Network.Mode, ModePos: base.Network.ModePos,
			Allow:     slices.Clone(base.Network.Allow),
			Deny:      slices.Clone(base.Network.Deny),
			Ask:       slices.Clone(base.Network.Ask),
			HostPorts: slices.Clone(base.Network.HostPorts),
		}
		p.Files = Files{Mounts: slices.Clone(base.Files.Mounts), Rules: slices.Clone(base.Files.Rules), Caches: slices.Clone(base.Files.Caches)}
		p.Git = Git{Repos: slices.Clone(base.Git.Repos)}
		p.SSH = SSH{CertTTL: base.SSH.CertTTL, Allow: slices.Clone(base.SSH.Allow), Deny: slices.Clone(base.SSH.Deny)}
		p.Credentials = slices.Clone(base.Credentials)
		p.Log = Log{Redact: slices.Clone(base.Log.Redact)}
		p.Ask = base.Ask
	}
	if l.ask.Timeout != 0 {
		p.Ask.Timeout, p.Ask.Pos = l.ask.Timeout, l.ask.Pos
	}
	if l.ask.Max != 0 {
		p.Ask.Max, p.Ask.Pos = l.ask.Max, l.ask.Pos
	}
	p.Log.Redact = append(p.Log.Redact, l.log.Redact...)
	if l.network.Mode != "" {
		p.Network.Mode, p.Network.ModePos = l.network.Mode, l.network.ModePos
	}
	if p.Network.Mode == "" {
		p.Network.Mode = DefaultDeny
	}
	p.Network.Allow = append(p.Network.Allow, l.network.Allow...)
	p.Network.Deny = append(p.Network.Deny, l.network.Deny...)
	p.Network.Ask = append(p.Network.Ask, l.network.Ask...)
	p.Network.HostPorts = append(p.Network.HostPorts, l.network.HostPorts...)
	p.Files.Mounts = append(p.Files.Mounts, l.files.Mounts...)
	p.Files.Rules = append(p.Files.Rules, l.files.Rules...)
	p.Files.Caches = append(p.Files.Caches, l.files.Caches...)
	p.Git.Repos = append(p.Git.Repos, l.git.Repos...)
	if l.ssh.CertTTL != 0 {
		p.SSH.CertTTL = l.ssh.CertTTL
	}
	if p.SSH.CertTTL == 0 {
		p.SSH.CertTTL = DefaultCertTTL
	}
	p.SSH.Allow = append(p.SSH.Allow, l.ssh.Allow...)
	p.SSH.Deny = append(p.SSH.Deny, l.ssh.Deny...)
	p.Credentials = append(p.Credentials, l.credentials...)
}

func portsOverlap(a, b []PortRange) bool {
	if len(a) == 0 || len(b) == 0 {
		return true
	}
	for _, x := range a {
		for _, y := range b {
			if x.Lo <= y.Hi && y.Lo <= x.Hi {
				return true
			}
		}
	}
	return false
}

// validate checks the resolved profile for contradictions: things that
// are each well-formed but together say two different things. Errors point
// at the later of the two rules.
func (d *decoder) validate(p *Profile) {
	n := &p.Network
	if n.Mode == DenyAll {
		for _, r := range n.Allow {
			d.errorAt(r.Pos, "%s: network.mode is deny-all, so this allow rule can never apply; set mode: default-deny", r.Where)
		}
		for _, r := range n.Ask {
			d.errorAt(r.Pos, "%s: network.mode is deny-all, so this ask rule can never apply; set mode: default-deny", r.Where)
		}
		for _, hp := range n.HostPorts {
			d.errorAt(hp.Pos, "network.host_ports: network.mode is deny-all, so port %d can never be reached; set mode: default-deny", hp.Port)
		}
	}
	for i, hp := range n.HostPorts {
		for _, prev := range n.HostPorts[:i] {
			if prev.Port == hp.Port {
				d.errorAt(hp.Pos, "network.host_ports: port %d is listed twice (also at %s)", hp.Port, prev.Pos)
			}
		}
	}
	sameDest := func(a, b NetRule) bool {
		return a.Domain == b.Domain && a.CIDR == b.CIDR &&
			(a.Proto == "" || b.Proto == "" || a.Proto == b.Proto) && portsOverlap(a.Ports, b.Ports)
	}
	for _, a := range n.Allow {
		for _, dr := range n.Deny {
			if sameDest(a, dr) {
				what := "domain " + a.Domain
				if a.Domain == "" {
					what = "cidr " + a.CIDR.String()
				}
				later, earlier := a, dr
				if d.after(dr.Pos, a.Pos) {
					later, earlier = dr, a
				}
				d.errorAt(later.Pos, "%s: %s is both allowed and denied (%s at %s); remove one", later.Where, what, earlier.Where, earlier.Pos)
			}
		}
	}

	f := &p.Files
	for i, m := range f.Mounts {
		for _, prev := range f.Mounts[:i] {
			if prev.Guest == m.Guest {
				d.errorAt(m.Pos, "files.mounts: guest path %s is mounted twice (also at %s)", m.Guest, prev.Pos)
			}
		}
	}
	for i, r := range f.Rules {
		for _, prev := range f.Rules[:i] {
			if prev.Path == r.Path {
				if prev.Access == r.Access {
					d.errorAt(r.Pos, "%s: duplicate rule for %s (also at %s)", r.Where, r.Path, prev.Pos)
				} else {
					d.errorAt(r.Pos, "%s: %s is %s here but %s at %s; a profile cannot override its base, remove one", r.Where, r.Path, r.Access, prev.Access, prev.Pos)
				}
			}
		}
	}

	for i, r := range p.Git.Repos {
		if r.Push == Deny {
			for _, f := range r.Refs {
				if f.Push == Allow || f.Delete == Allow || f.ForcePush == Allow {
					d.errorAt(f.Pos, "%s: allows pushing to %s but the repo sets push: deny, which wins", f.Where, f.Ref)
				}
			}
		}
		for _, f := range r.Refs {
			if f.Push == Deny && (f.Delete == Allow || f.ForcePush == Allow) {
				d.errorAt(f.Pos, "%s: push: deny wins over delete/force_push: allow; remove one", f.Where)
			}
		}
		for _, prev := range p.Git.Repos[:i] {
			if prev.Repo != r.Repo {
				continue
			}
			for _, v := range [][2]Verdict{{prev.Read, r.Read}, {prev.Push, r.Push}, {prev.Delete, r.Delete}, {prev.ForcePush, r.ForcePush}} {
				if v[0] != Unset && v[1] != Unset && v[0] != v[1] {
					d.errorAt(r.Pos, "%s: repo %s contradicts %s at %s; a profile cannot override its base", r.Where, r.Repo, prev.Where, prev.Pos)
					break
				}
			}
		}
	}

	for _, a := range p.SSH.Allow {
		for _, dr := range p.SSH.Deny {
			if a.Host == dr.Host && a.User == dr.User && portsOverlap(a.Ports, dr.Ports) {
				later, earlier := a, dr
				if d.after(dr.Pos, a.Pos) {
					later, earlier = dr, a
				}
				d.errorAt(later.Pos, "%s: ssh to %s is both allowed and denied (%s at %s); remove one", later.Where, a.Host, earlier.Where, earlier.Pos)
			}
		}
	}

	for i, c := range p.Credentials {
		for _, prev := range p.Credentials[:i] {
			switch {
			case prev.Name == c.Name:
				d.errorAt(c.Pos, "credential %q is defined twice (also at %s)", c.Name, prev.Pos)
			case c.Domain != "" && prev.Domain == c.Domain && strings.EqualFold(prev.Header, c.Header),
				c.Forge != "" && prev.Forge == c.Forge,
				c.SSHHost != "" && prev.SSHHost == c.SSHHost:
				d.errorAt(c.Pos, "credential %q is bound to the same place as %q (at %s)", c.Name, prev.Name, prev.Pos)
			}
		}
	}
}

// after reports whether a was written after b: later in the same file, or
// in the extending file when b is in the base.
func (d *decoder) after(a, b Pos) bool {
	if a.File != b.File {
		return a.File == d.file
	}
	return a.Line > b.Line || a.Line == b.Line && a.Col > b.Col
}
