package service

import (
	"context"

	"github.com/smx-dev/smx/internal/preset"
)

// PresetEntry is one agent preset as ListPresets gives it: the preset, or
// why it is broken (a user's file that does not parse).
type PresetEntry struct {
	*preset.Preset
	Name  string `json:"name"`
	Error string `json:"error,omitempty"`
}

// ListPresets lists the shipped presets and the user's own (in
// preset.UserDir(), which win over a shipped one of the same name),
// sorted by name; a broken one is listed with its error, not skipped.
func (s *Service) ListPresets(ctx context.Context) ([]PresetEntry, error) {
	names, err := preset.List(preset.UserDir())
	if err != nil {
		return nil, err
	}
	var list []PresetEntry
	for _, n := range names {
		p, err := preset.Get(n, preset.UserDir())
		r := PresetEntry{Preset: p, Name: n}
		if err != nil {
			r.Error = err.Error()
		}
		list = append(list, r)
	}
	return list, nil
}
