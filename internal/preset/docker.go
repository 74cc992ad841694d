package preset

import (
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/presets"
)

// WithDocker returns the preset with Docker Engine added (`agent run
// --docker`): the shipped docker preset is the one definition of what that
// takes, and its parts go on top of p: its Debian packages join p's recipe
// (so p gets an image of its own, built once), its services (dockerd)
// start before p's agent, and its profile's network.allow rules (the
// registries' names) are appended to p's. p's command, user and
// credentials stay.
func (p *Preset) WithDocker() (*Preset, error) {
	b, err := presets.FS.ReadFile("docker.yaml")
	if err != nil {
		return nil, err
	}
	d, err := Parse("docker", "builtin", b)
	if err != nil {
		return nil, err
	}
	if p.Name == d.Name {
		return p, nil
	}
	q := *p
	q.Image.Apt = slices.Clone(p.Image.Apt)
	for _, a := range d.Image.Apt {
		if !slices.Contains(q.Image.Apt, a) {
			q.Image.Apt = append(q.Image.Apt, a)
		}
	}
	q.Services = slices.Clone(p.Services)
	for _, sv := range d.Services {
		if !slices.ContainsFunc(q.Services, func(o Service) bool { return o.Name == sv.Name }) {
			q.Services = append(q.Services, sv)
		}
	}
	if q.Profile, err = appendNetworkAllow(p.Profile, d.Profile); err != nil {
		return nil, fmt.Errorf("preset %s with --docker: %w", p.Name, err)
	}
	return &q, nil
}

// appendNetworkAllow appends layer's network.allow rules to profile's
// (making the list when profile has none).
func appendNetworkAllow(profile, layer string) (string, error) {
	var doc, add yaml.Node
	if err := yaml.Unmarshal([]byte(profile), &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return "", fmt.Errorf("profile is not a YAML mapping: %w", errdefs.ErrInvalid)
	}
	if err := yaml.Unmarshal([]byte(layer), &add); err != nil || len(add.Content) == 0 {
		return "", fmt.Errorf("the docker preset's profile: %v: %w", err, errdefs.ErrInvalid)
	}
	rules := mappingValue((*yaml.Node)(mappingValue(add.Content[0], "network")), "allow").contentOr()
	if len(rules) == 0 {
		return profile, nil
	}
	root := doc.Content[0]
	network := (*yaml.Node)(mappingValue(root, "network"))
	if network == nil {
		network = &yaml.Node{Kind: yaml.MappingNode}
		setNode(root, "network", network)
	}
	allow := (*yaml.Node)(mappingValue(network, "allow"))
	if allow == nil {
		allow = &yaml.Node{Kind: yaml.SequenceNode}
		setNode(network, "allow", allow)
	}
	allow.Content = append(allow.Content, rules...)
	out, err := yaml.Marshal(&doc)
	if err != nil {
		return "", err
	}
	return string(out), nil
}
