package policy

import (
	"bytes"
	"io"
	"strings"

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
	Log         yLog     `yaml:"log,omitempty"`
	Ask         *yAsk    `yaml:"ask,omitempty"`
}

type yAsk struct {
	Timeout string `yaml:"timeout,omitempty"`
	Max     int    `yaml:"max,omitempty"`
}

type yLog struct {
	Redact []string `yaml:"redact,omitempty"`
}

type yNetwork struct {
	Mode      string     `yaml:"mode"`
	Allow     []yNetRule `yaml:"allow,omitempty"`
	Deny      []yNetRule `yaml:"deny,omitempty"`
	Ask       []yNetRule `yaml:"ask,omitempty"`
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
	Caches []string    `yaml:"caches,omitempty"`
}

type yMount struct {
	Host  string `yaml:"host"`
	Guest string `yaml:"guest"`
	UID   uint32 `yaml:"uid,omitempty"`
	GID   uint32 `yaml:"gid,omitempty"`
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
	// PushOptions: named push options a push may carry.
	PushOptions []string `yaml:"push_options,flow,omitempty"`
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
	GitRoot string    `yaml:"git_root,omitempty"`
	Ask     bool      `yaml:"ask,omitempty"`
}

type yCred struct {
	Name    string            `yaml:"name"`
	From    string            `yaml:"from"`
	Domain  string            `yaml:"domain,omitempty"`
	Header  string            `yaml:"header,omitempty"`
	Format  string            `yaml:"format,omitempty"`
	Forge   string            `yaml:"forge,omitempty"`
	SSHHost string            `yaml:"ssh_host,omitempty"`
	Methods []string          `yaml:"methods,flow,omitempty"`
	Paths   []string          `yaml:"paths,omitempty"`
	Headers map[string]string `yaml:"headers,omitempty"`
	Deny    []string          `yaml:"deny_paths,omitempty"`
	Budget  *yBudget          `yaml:"budget,omitempty"`
	Ask     bool              `yaml:"ask,omitempty"`
}

type yBudget struct {
	Tokens   int64  `yaml:"tokens,omitempty"`
	Requests int64  `yaml:"requests,omitempty"`
	Per      string `yaml:"per"`
	Ask      bool   `yaml:"ask,omitempty"`
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
		y := ySSHRule{Host: r.Host, User: r.User, Ports: yPorts(r.Ports), SFTP: yVerdict(r.SFTP), Forward: r.Forward, HostKey: r.HostKey, GitRoot: r.GitRoot, Ask: r.Ask}
		if r.Env != nil {
			env := r.Env
			y.Env = &env
		}
		out = append(out, y)
	}
	return out
}

func encodeProfile(w io.Writer, p *Profile, withName bool) error {
	y := yamlOf(p, withName)
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(&y); err != nil {
		return err
	}
	return enc.Close()
}

func yamlOf(p *Profile, withName bool) yProfile {
	y := yProfile{
		Network: yNetwork{Mode: string(p.Network.Mode), Allow: yNet(p.Network.Allow), Deny: yNet(p.Network.Deny), Ask: yNet(p.Network.Ask)},
		SSH:     ySSH{CertTTL: p.SSH.CertTTL.String(), Allow: ySSHRules(p.SSH.Allow), Deny: ySSHRules(p.SSH.Deny)},
	}
	if withName {
		y.Name = p.Name
	}
	if p.Ask.Timeout != 0 || p.Ask.Max != 0 {
		y.Ask = &yAsk{Max: p.Ask.Max}
		if p.Ask.Timeout != 0 {
			y.Ask.Timeout = p.Ask.Timeout.String()
		}
	}
	for _, hp := range p.Network.HostPorts {
		y.Network.HostPorts = append(y.Network.HostPorts, int(hp.Port))
	}
	for _, m := range p.Files.Mounts {
		y.Files.Mounts = append(y.Files.Mounts, yMount{Host: m.Host, Guest: m.Guest, UID: m.UID, GID: m.GID})
	}
	for _, r := range p.Files.Rules {
		y.Files.Rules = append(y.Files.Rules, yFileRule{Path: r.Path, Access: string(r.Access)})
	}
	for _, c := range p.Files.Caches {
		y.Files.Caches = append(y.Files.Caches, c.Spec)
	}
	for _, r := range p.Git.Repos {
		yr := yRepo{Repo: r.Repo, Read: yVerdict(r.Read), Push: yVerdict(r.Push), Delete: yVerdict(r.Delete), ForcePush: yVerdict(r.ForcePush),
			PushOptions: r.PushOptions}
		for _, f := range r.Refs {
			yr.Refs = append(yr.Refs, yRef{Ref: f.Ref, Push: yVerdict(f.Push), Delete: yVerdict(f.Delete), ForcePush: yVerdict(f.ForcePush)})
		}
		y.Git.Repos = append(y.Git.Repos, yr)
	}
	for _, c := range p.Credentials {
		yc := yCred{Name: c.Name, From: c.From, Domain: c.Domain, Header: c.Header, Forge: c.Forge, SSHHost: c.SSHHost,
			Methods: c.Methods, Paths: c.Paths, Deny: c.DenyPaths, Ask: c.Ask}
		for _, h := range c.Headers {
			if yc.Headers == nil {
				yc.Headers = map[string]string{}
			}
			yc.Headers[h.Name] = h.Value
		}
		if c.Format != "{}" {
			yc.Format = c.Format
		}
		if b := c.Budget; b != nil {
			yc.Budget = &yBudget{Tokens: b.Tokens, Requests: b.Requests, Per: b.Per, Ask: b.Ask}
		}
		y.Credentials = append(y.Credentials, yc)
	}
	for _, r := range p.Log.Redact {
		y.Log.Redact = append(y.Log.Redact, r.Pattern)
	}
	return y
}

// FrozenYAML is YAML with the name, plus comments that say where each
// rule was written ("# @ team.yaml:5:7 network.allow[0]") and which file
// the profile came from. A sandbox keeps its profile in this form, and
// LoadFrozen reads the comments back, so that the rules a sandbox's
// decisions cite are the user's file and line, not the copy's. It parses
// (with Parse or Load) to the same Hash.
func (p *Profile) FrozenYAML() ([]byte, error) {
	y := yamlOf(p, true)
	var root yaml.Node
	if err := root.Encode(&y); err != nil {
		return nil, err
	}
	root.HeadComment = "smx: the frozen copy of profile " + p.Name + " (" + oneLine(p.Source) + ").\n" +
		"The \"@ FILE:LINE:COL RULE\" comments say where each rule was written; decisions cite them."
	mark := func(n *yaml.Node, pos Pos, where string) {
		if n != nil && pos.File != "" && !strings.ContainsAny(pos.File+where, "\r\n") {
			n.HeadComment = srcMark + pos.String() + " " + where
		}
	}
	item := func(seq *yaml.Node, i int) *yaml.Node {
		if seq == nil || i >= len(seq.Content) {
			return nil
		}
		return seq.Content[i]
	}
	net := mapValue(&root, "network")
	if m := mapValue(net, "mode"); m != nil && p.Network.ModePos.File != "" && !strings.ContainsAny(p.Network.ModePos.File, "\r\n") {
		m.LineComment = srcMark + p.Network.ModePos.String() + " network.mode"
	}
	for i, r := range p.Network.Allow {
		mark(item(mapValue(net, "allow"), i), r.Pos, r.Where)
	}
	for i, r := range p.Network.Deny {
		mark(item(mapValue(net, "deny"), i), r.Pos, r.Where)
	}
	for i, r := range p.Network.Ask {
		mark(item(mapValue(net, "ask"), i), r.Pos, r.Where)
	}
	for i, r := range p.Files.Rules {
		mark(item(mapValue(mapValue(&root, "files"), "rules"), i), r.Pos, r.Where)
	}
	repos := mapValue(mapValue(&root, "git"), "repos")
	for i, r := range p.Git.Repos {
		mark(item(repos, i), r.Pos, r.Where)
		for j, f := range r.Refs {
			mark(item(mapValue(item(repos, i), "refs"), j), f.Pos, f.Where)
		}
	}
	ssh := mapValue(&root, "ssh")
	for i, r := range p.SSH.Allow {
		mark(item(mapValue(ssh, "allow"), i), r.Pos, r.Where)
	}
	for i, r := range p.SSH.Deny {
		mark(item(mapValue(ssh, "deny"), i), r.Pos, r.Where)
	}
	for i, c := range p.Credentials {
		mark(item(mapValue(&root, "credentials"), i), c.Pos, "credentials")
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// mapValue returns the value of key in mapping n, or nil.
func mapValue(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func oneLine(s string) string { return strings.NewReplacer("\r", " ", "\n", " ").Replace(s) }
