package service

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/preset"
	"github.com/smx-dev/smx/internal/statedir"
)

// presetProfile writes the preset's profile where sandboxes can name it
// (STATE/presets/NAME.yaml) and returns its path. With a base profile,
// the preset's credentials go on top of it instead of dev: its rules, the
// preset's credential bindings.
func (s *Service) presetProfile(p *preset.Preset, base string) (string, error) {
	src := []byte(p.Profile)
	dir := filepath.Join(s.state.Root, "presets")
	given := base != ""
	if given {
		ref := base
		if _, ok := policy.Builtin(ref); !ok {
			if !strings.ContainsAny(ref, "/.") {
				if f := filepath.Join(s.state.Profiles(), ref+".yaml"); fileExists(f) {
					base = f
				}
			}
			// extends takes a path relative to the extending file.
			if abs, err := filepath.Abs(base); err == nil && fileExists(base) {
				if rel, err := filepath.Rel(dir, abs); err == nil {
					base = rel
				}
			}
		}
		var doc yaml.Node
		if err := yaml.Unmarshal(src, &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
			return "", fmt.Errorf("preset %s: profile is not a YAML mapping: %w", p.Name, errdefs.ErrInvalid)
		}
		m := doc.Content[0]
		set := false
		for i := 0; i+1 < len(m.Content); i += 2 {
			if m.Content[i].Value == "extends" {
				m.Content[i+1].Value, set = base, true
			}
		}
		if !set {
			m.Content = append([]*yaml.Node{{Kind: yaml.ScalarNode, Value: "extends"}, {Kind: yaml.ScalarNode, Value: base}}, m.Content...)
		}
		out, err := yaml.Marshal(&doc)
		if err != nil {
			return "", err
		}
		src = out
		base = ref
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	name := p.Name
	if given {
		name += "-on-" + strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' {
				return r
			}
			return '_'
		}, strings.ToLower(filepath.Base(base)))
	}
	path := filepath.Join(dir, name+".yaml")
	hdr := "# written by `smx agent run` from preset " + p.Name + " (" + p.Source + "); rewritten at every run\n"
	if err := statedir.WriteFileAtomic(path, append([]byte(hdr), src...), 0o600); err != nil {
		return "", err
	}
	if _, err := policy.Load(path); err != nil {
		return "", fmt.Errorf("preset %s: profile: %w", p.Name, err)
	}
	return path, nil
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }
