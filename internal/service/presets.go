package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/image"
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

// GetPreset returns preset name, a user's own (in preset.UserDir())
// winning over a shipped one.
func (s *Service) GetPreset(name string) (*preset.Preset, error) {
	return preset.Get(name, preset.UserDir())
}

// PresetImage returns the preset's image, building it first when the store
// has none for this recipe (images are named by the recipe's hash). The
// build's output goes to progress line by line.
func (s *Service) PresetImage(ctx context.Context, p *preset.Preset, progress func(AgentProgress)) (*image.Image, error) {
	if progress == nil {
		progress = func(AgentProgress) {}
	}
	name := p.ImageName()
	img, err := s.images().Get(name)
	if err == nil || !errors.Is(err, errdefs.ErrNotFound) {
		return img, err
	}
	progress(AgentProgress{Stage: "image", Message: fmt.Sprintf("building image %s for preset %s (once; minutes)", name, p.Name)})
	lw := &lineWriter{fn: func(l string) { progress(AgentProgress{Stage: "build", Message: l}) }}
	img, err = s.images().BuildRecipe(ctx, name, "preset:"+p.Name+" recipe:"+p.Image.Hash()[:12],
		image.Recipe{Apt: p.Image.Apt, Npm: p.Image.Npm}, lw)
	lw.flush()
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("image build interrupted; nothing was kept: %w", ctx.Err())
	}
	return img, err
}

// lineWriter calls fn with each complete line written to it (a carriage
// return ends a line too: progress bars redraw with it).
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexAny(w.buf, "\r\n")
		if i < 0 {
			break
		}
		if l := string(w.buf[:i]); strings.TrimSpace(l) != "" {
			w.fn(l)
		}
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.fn(string(w.buf))
		w.buf = nil
	}
}
