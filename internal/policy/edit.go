package policy

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/smx-dev/smx/internal/errdefs"
)

// ApprovedMark heads the rules `smx approve --always` added to a profile
// file: they are appended, in answer order, after the rules the user
// wrote, and each carries a comment naming its approval.
const ApprovedMark = "--- added by smx approve --always (each rule names its approval) ---"

// AddRule appends a rule to the list at section (a dotted path of
// mapping keys, e.g. "network.allow") of the profile file data, keeping
// the file's comments and order (it edits the YAML node tree), and returns
// the new file and the rule as one line of YAML. fields are the rule's
// keys and values in order; a value written "[...]" is a flow list.
// comment is put above the rule. It does no I/O; parse the result to
// validate it.
func AddRule(data []byte, section string, fields [][2]string, comment string) ([]byte, string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, "", fmt.Errorf("policy: add rule: %w: %v", errdefs.ErrInvalid, err)
	}
	if doc.Kind == 0 {
		doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, "", fmt.Errorf("policy: add rule: the profile is not a YAML mapping: %w", errdefs.ErrInvalid)
	}
	if len(fields) == 0 || section == "" {
		return nil, "", errors.New("policy: add rule: empty rule")
	}
	n := doc.Content[0]
	keys := strings.Split(section, ".")
	for i, k := range keys {
		v := mapValue(n, k)
		last := i == len(keys)-1
		if v == nil || isNull(v) {
			nv := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			if last {
				nv = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
			}
			if v == nil {
				n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: k}, nv)
			} else {
				*v = *nv
			}
			v = nv
		}
		if last && v.Kind != yaml.SequenceNode || !last && v.Kind != yaml.MappingNode {
			return nil, "", fmt.Errorf("policy: add rule: %s is not a %s in the profile: %w", strings.Join(keys[:i+1], "."),
				map[bool]string{true: "list", false: "mapping"}[last], errdefs.ErrInvalid)
		}
		n = v
	}
	n.Style = 0 // a flow list ([...]) becomes a block list so the comment fits
	item := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	var flow []string
	for _, f := range fields {
		k := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: f[0]}
		var v *yaml.Node
		if strings.HasPrefix(f[1], "[") && strings.HasSuffix(f[1], "]") {
			v = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", Style: yaml.FlowStyle}
			for _, e := range strings.Split(strings.Trim(f[1], "[]"), ",") {
				if e = strings.TrimSpace(e); e != "" {
					v.Content = append(v.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: e})
				}
			}
		} else {
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: f[1]}
		}
		item.Content = append(item.Content, k, v)
		flow = append(flow, f[0]+": "+f[1])
	}
	marked := false
	for _, it := range n.Content {
		if strings.Contains(it.HeadComment, ApprovedMark) {
			marked = true
		}
	}
	c := "# " + oneLine(comment)
	if !marked {
		c = "# " + ApprovedMark + "\n" + c
	}
	item.HeadComment = c
	n.Content = append(n.Content, item)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, "", fmt.Errorf("policy: add rule: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, "", err
	}
	return buf.Bytes(), section + ": {" + strings.Join(flow, ", ") + "}", nil
}

// AddRefRule adds a ref rule (fields: ref and the access that is allowed)
// to the git.repos entry whose repo is exactly repo, creating that entry
// at the end of git.repos when there is none; otherwise as AddRule.
func AddRefRule(data []byte, repo string, fields [][2]string, comment string) ([]byte, string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, "", fmt.Errorf("policy: add rule: %w: %v", errdefs.ErrInvalid, err)
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		for _, it := range seqItems(mapValue(mapValue(doc.Content[0], "git"), "repos")) {
			if r := mapValue(it, "repo"); r != nil && strings.EqualFold(r.Value, repo) {
				// Edit this entry through AddRule on a document of its own
				// refs, then put the result back.
				refs := mapValue(it, "refs")
				if refs == nil {
					refs = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
					it.Content = append(it.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "refs"}, refs)
				}
				if refs.Kind != yaml.SequenceNode {
					break
				}
				item, line := ruleNode(fields, comment, refs)
				refs.Style = 0
				refs.Content = append(refs.Content, item)
				out, err := encodeNode(&doc)
				return out, "git.repos[repo " + repo + "].refs: " + line, err
			}
		}
	}
	out, line, err := AddRule(data, "git.repos", [][2]string{{"repo", repo}}, comment)
	if err != nil {
		return nil, "", err
	}
	// The new entry is the last of git.repos: give it the ref rule.
	if err := yaml.Unmarshal(out, &doc); err != nil {
		return nil, "", err
	}
	items := seqItems(mapValue(mapValue(doc.Content[0], "git"), "repos"))
	last := items[len(items)-1]
	refs := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	item, rl := ruleNode(fields, "", refs)
	item.HeadComment = ""
	refs.Content = append(refs.Content, item)
	last.Content = append(last.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "refs"}, refs)
	out, err = encodeNode(&doc)
	return out, strings.TrimSuffix(line, "}") + ", refs: [" + rl + "]}", err
}

func seqItems(n *yaml.Node) []*yaml.Node {
	if n == nil || n.Kind != yaml.SequenceNode {
		return nil
	}
	return n.Content
}

// ruleNode builds a rule's mapping node with its comment (the section
// mark when list has none yet) and its one-line form.
func ruleNode(fields [][2]string, comment string, list *yaml.Node) (*yaml.Node, string) {
	item := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	var flow []string
	for _, f := range fields {
		item.Content = append(item.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: f[0]}, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: f[1]})
		flow = append(flow, f[0]+": "+f[1])
	}
	if comment != "" {
		marked := false
		for _, it := range list.Content {
			if strings.Contains(it.HeadComment, ApprovedMark) {
				marked = true
			}
		}
		c := "# " + oneLine(comment)
		if !marked {
			c = "# " + ApprovedMark + "\n" + c
		}
		item.HeadComment = c
	}
	return item, "{" + strings.Join(flow, ", ") + "}"
}

func encodeNode(doc *yaml.Node) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("policy: add rule: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
