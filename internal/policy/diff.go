package policy

import (
	"bytes"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Change is one rule that one profile has and another has not (`smx
// profile diff`). Rules are compared as resolved (extends applied,
// defaults written out) and as sets: the order of rules never changes a
// decision (deny beats allow, the most specific file rule wins), so it is
// not a difference.
type Change struct {
	Section string `json:"section"` // e.g. "network.allow", "git.repos", "ssh.cert_ttl"
	Op      string `json:"op"`      // "add" (B has it, A has not) or "remove"
	Rule    string `json:"rule"`    // the rule as one line of YAML
}

func (c Change) String() string {
	sign := "+"
	if c.Op == "remove" {
		sign = "-"
	}
	return sign + " " + c.Section + ": " + c.Rule
}

// Diff lists what b adds to a and what it removes from it, rule by rule:
// removals first, then additions, each in section order. A git repo rule
// is compared as the repo's own settings plus one entry per ref rule, so
// a ref added to a repo shows as that ref alone. Names and where the rules
// were written are not compared.
func Diff(a, b *Profile) []Change {
	ra, rb := ruleLines(a), ruleLines(b)
	var out []Change
	for _, op := range []string{"remove", "add"} {
		from, to := ra, rb
		if op == "add" {
			from, to = rb, ra
		}
		for _, e := range from {
			if !containsEntry(to, e) {
				out = append(out, Change{Section: e.section, Op: op, Rule: e.rule})
			}
		}
	}
	return out
}

type ruleEntry struct{ section, rule string }

func containsEntry(es []ruleEntry, e ruleEntry) bool {
	for _, x := range es {
		if x == e {
			return true
		}
	}
	return false
}

// ruleLines flattens p to one entry per rule, in section order, each rule
// sorted within its section.
func ruleLines(p *Profile) []ruleEntry {
	y := yamlOf(p, false)
	// Port lists are sets too.
	for _, rs := range [][]yNetRule{y.Network.Allow, y.Network.Deny} {
		for i := range rs {
			sortPorts(rs[i].Ports)
		}
	}
	for _, rs := range [][]ySSHRule{y.SSH.Allow, y.SSH.Deny} {
		for i := range rs {
			sortPorts(rs[i].Ports)
		}
	}
	sort.Ints(y.Network.HostPorts)
	var out []ruleEntry
	add := func(section string, vs ...any) {
		var lines []string
		for _, v := range vs {
			lines = append(lines, oneLineYAML(v))
		}
		sort.Strings(lines)
		for _, l := range lines {
			out = append(out, ruleEntry{section, l})
		}
	}
	add("network.mode", y.Network.Mode)
	add("network.allow", anys(y.Network.Allow)...)
	add("network.deny", anys(y.Network.Deny)...)
	add("network.host_ports", anys(y.Network.HostPorts)...)
	add("files.mounts", anys(y.Files.Mounts)...)
	add("files.caches", anys(y.Files.Caches)...)
	add("files.rules", anys(y.Files.Rules)...)
	var repos, refs []any
	for _, r := range y.Git.Repos {
		rs := r.Refs
		r.Refs = nil
		repos = append(repos, r)
		for _, f := range rs {
			refs = append(refs, struct {
				Repo string `yaml:"repo"`
				yRef `yaml:",inline"`
			}{r.Repo, f})
		}
	}
	add("git.repos", repos...)
	add("git.refs", refs...)
	add("ssh.cert_ttl", y.SSH.CertTTL)
	add("ssh.allow", anys(y.SSH.Allow)...)
	add("ssh.deny", anys(y.SSH.Deny)...)
	add("credentials", anys(y.Credentials)...)
	add("log.redact", anys(y.Log.Redact)...)
	return out
}

// sortPorts orders ports as yPorts writes them (ints and "LO-HI") by
// their first port.
func sortPorts(ps []any) {
	lo := func(v any) int {
		if i, ok := v.(int); ok {
			return i
		}
		s, _ := v.(string)
		n, _ := strconv.Atoi(strings.SplitN(s, "-", 2)[0])
		return n
	}
	sort.SliceStable(ps, func(i, j int) bool { return lo(ps[i]) < lo(ps[j]) })
}

func anys[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// oneLineYAML renders v in YAML's flow style on one line.
func oneLineYAML(v any) string {
	var n yaml.Node
	if err := n.Encode(v); err != nil {
		return "?"
	}
	var flow func(*yaml.Node)
	flow = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
			n.Style = yaml.FlowStyle
		}
		for _, c := range n.Content {
			flow(c)
		}
	}
	flow(&n)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&n); err != nil {
		return "?"
	}
	enc.Close()
	return strings.Join(strings.Fields(buf.String()), " ")
}
