package policy

import (
	"io"

	"go.yaml.in/yaml/v3"
)

// The canonical form: every section present, defaults written out, rules in
// evaluation order (base profile first). Parse reads it back to the same
// Hash.

type yProfile struct {
	Name        string   `yaml:"name,omitempty"`
	Network     yNetwork `yaml:"network"`
	Files       yFiles   `yaml:"files"`
	Git         yGit     `yaml:"git"`
	SSH         ySSH     `yaml:"ssh"`
	Credentials []yCred  `yaml:"credentials,omitempty"`
}

type yNetwork struct {
	Mode      string     `yaml:"mode"`
	Allow     []yNetRule `yaml:"allow,omitempty"`
	Deny      []yNetRule `yaml:"deny,omitempty"`
	HostPorts []int      `yaml:"host_ports,flow,omitempty"`
}

type yNetRule struct {
	Domain string `yaml:"domain,omitempty"`
	CIDR   string `yaml:"cidr,omitempty"`
	Ports  []any  `yaml:"ports,flow,omitempty"`
	Proto  string `yaml:"proto,omitempty"`
}

type yFiles struct {
	Mounts []yMount    `yaml:"mounts,omitempty"`
	Rules  []yFileRule `yaml:"rules,omitempty"`
}

type yMount struct {
	Host  string `yaml:"host"`
	Guest string `yaml:"guest"`
}

type yFileRule struct {
	Path   string `yaml:"path"`
	Access string `yaml:"access"`
}

type yGit struct {
	Repos []yRepo `yaml:"repos,omitempty"`
}

type yRepo struct {
	Repo      string `yaml:"repo"`
	Read      string `yaml:"read,omitempty"`
	Push      string `yaml:"push,omitempty"`
	Delete    string `yaml:"delete,omitempty"`
	ForcePush string `yaml:"force_push,omitempty"`
	Refs      []yRef `yaml:"refs,omitempty"`
}

type yRef struct {
	Ref       string `yaml:"ref"`
	Push      string `yaml:"push,omitempty"`
	Delete    string `yaml:"delete,omitempty"`
	ForcePush string `yaml:"force_push,omitempty"`
}

type ySSH struct {
	CertTTL string     `yaml:"cert_ttl"`
	Allow   []ySSHRule `yaml:"allow,omitempty"`
	Deny    []ySSHRule `yaml:"deny,omitempty"`
}

type ySSHRule struct {
	Host    string    `yaml:"host"`
	User    string    `yaml:"user,omitempty"`
	Ports   []any     `yaml:"ports,flow"`
	SFTP    string    `yaml:"sftp,omitempty"`
	Forward []string  `yaml:"forward,omitempty,flow"`
	Env     *[]string `yaml:"env,omitempty,flow"` // nil: the default; empty: none
	HostKey string    `yaml:"host_key,omitempty"`
}

type yCred struct {
	Name    string `yaml:"name"`
	From    string `yaml:"from"`
	Domain  string `yaml:"domain,omitempty"`
	Header  string `yaml:"header,omitempty"`
	Format  string `yaml:"format,omitempty"`
	Forge   string `yaml:"forge,omitempty"`
	SSHHost string `yaml:"ssh_host,omitempty"`
}

func yPorts(ps []PortRange) []any {
	var out []any
	for _, p := range ps {
		if p.Lo == p.Hi {
			out = append(out, int(p.Lo))
		} else {
			out = append(out, p.String())
		}
	}
	return out
}

func yVerdict(v Verdict) string {
	if v == Unset {
		return ""
	}
	return v.String()
}

func yNet(rs []NetRule) []yNetRule {
	var out []yNetRule
	for _, r := range rs {
		y := yNetRule{Domain: r.Domain, Ports: yPorts(r.Ports), Proto: r.Proto}
		if r.Domain == "" {
			y.CIDR = r.CIDR.String()
		}
		out = append(out, y)
	}
	return out
}

func ySSHRules(rs []SSHRule) []ySSHRule {
	var out []ySSHRule
	for _, r := range rs {
		y := ySSHRule{Host: r.Host, User: r.User, Ports: yPorts(r.Ports), SFTP: yVerdict(r.SFTP), Forward: r.Forward, HostKey: r.HostKey}
		if r.Env != nil {
			env := r.Env
			y.Env = &env
		}
		out = append(out, y)
	}
	return out
}

func encodeProfile(w io.Writer, p *Profile, withName bool) error {
	y := yProfile{
		Network: yNetwork{Mode: string(p.Network.Mode), Allow: yNet(p.Network.Allow), Deny: yNet(p.Network.Deny)},
		SSH:     ySSH{CertTTL: p.SSH.CertTTL.String(), Allow: ySSHRules(p.SSH.Allow), Deny: ySSHRules(p.SSH.Deny)},
	}
	if withName {
		y.Name = p.Name
	}
	for _, hp := range p.Network.HostPorts {
		y.Network.HostPorts = append(y.Network.HostPorts, int(hp.Port))
	}
	for _, m := range p.Files.Mounts {
		y.Files.Mounts = append(y.Files.Mounts, yMount{Host: m.Host, Guest: m.Guest})
	}
	for _, r := range p.Files.Rules {
		y.Files.Rules = append(y.Files.Rules, yFileRule{Path: r.Path, Access: string(r.Access)})
	}
	for _, r := range p.Git.Repos {
		yr := yRepo{Repo: r.Repo, Read: yVerdict(r.Read), Push: yVerdict(r.Push), Delete: yVerdict(r.Delete), ForcePush: yVerdict(r.ForcePush)}
		for _, f := range r.Refs {
			yr.Refs = append(yr.Refs, yRef{Ref: f.Ref, Push: yVerdict(f.Push), Delete: yVerdict(f.Delete), ForcePush: yVerdict(f.ForcePush)})
		}
		y.Git.Repos = append(y.Git.Repos, yr)
	}
	for _, c := range p.Credentials {
		yc := yCred{Name: c.Name, From: c.From, Domain: c.Domain, Header: c.Header, Forge: c.Forge, SSHHost: c.SSHHost}
		if c.Format != "{}" {
			yc.Format = c.Format
		}
		y.Credentials = append(y.Credentials, yc)
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&y); err != nil {
		return err
	}
	return enc.Close()
}
