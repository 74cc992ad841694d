package service

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/agentconf"
	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/preset"
	"github.com/smx-dev/smx/internal/supervisor"
)

// presetSignIn picks how the preset's agent signs in: an imported sign-in
// when one is stored, else the API key (a missing one is said, not fatal:
// the gateway then refuses model requests, and says so in the log).
func (s *Service) presetSignIn(p *preset.Preset, progress func(AgentProgress)) (*preset.Preset, error) {
	if p.Credential == nil {
		return p, nil
	}
	store := creds.Store{Dir: s.state.Creds()}
	if _, err := store.OAuthOf(p.Credential.Secret); err == nil && p.Credential.OAuth != nil {
		return p.WithSignIn()
	}
	if _, err := store.Get(p.Credential.Secret); errors.Is(err, errdefs.ErrNotFound) {
		progress(AgentProgress{Stage: "warning", Message: fmt.Sprintf("no key for %s is stored: `smx creds login %s` stores one (or imports your sign-in with --import)", p.Name, p.Name)})
	}
	return p, nil
}

// importConfig collects the host user's configuration of p's agent for
// --import-config, saying what it left out as warnings.
func importConfig(p *preset.Preset, want bool, progress func(AgentProgress)) ([]preset.File, error) {
	if !want {
		return nil, nil
	}
	agent := p.Name
	if p.Credential != nil && p.Credential.OAuth != nil && p.Credential.OAuth.Import != "" {
		agent = p.Credential.OAuth.Import
	}
	if _, ok := agentconf.Sources[agent]; !ok {
		return nil, fmt.Errorf("--import-config: preset %s runs no agent whose configuration smx knows (claude, codex, gemini): %w", p.Name, errdefs.ErrInvalid)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return nil, fmt.Errorf("--import-config: %w", err)
	}
	imp, err := agentconf.Collect(home, agent, guestHome(p))
	if err != nil {
		return nil, err
	}
	for _, why := range imp.Skipped {
		progress(AgentProgress{Stage: "warning", Message: "--import-config: " + why})
	}
	if len(imp.Files) == 0 {
		progress(AgentProgress{Stage: "warning", Message: fmt.Sprintf("--import-config: no %s configuration found under %s", agent, home)})
	}
	files := make([]preset.File, 0, len(imp.Files))
	for _, f := range imp.Files {
		files = append(files, preset.File{Path: guestHome(p) + "/" + f.Path, Content: string(f.Data), Exec: f.Exec})
	}
	return files, nil
}

// guestHome is the preset user's home in the guest.
func guestHome(p *preset.Preset) string {
	if p.User == "" || p.User == "root" {
		return "/root"
	}
	return "/home/" + p.User
}

// mergeImported lays the user's imported files over the preset's. Where
// both write one file, the preset's settings win (they make the agent
// use the gateway's placeholder sign-in and trust /work): JSON objects
// merge, the preset's values over the user's; instructions (Markdown)
// are the preset's, then the user's; TOML keeps the user's entries that
// the preset does not set.
func mergeImported(files, imported []preset.File) []preset.File {
	out := slices.Clone(files)
	for _, im := range imported {
		i := slices.IndexFunc(out, func(f preset.File) bool { return f.Path == im.Path })
		if i < 0 {
			out = append(out, im)
			continue
		}
		switch mine := out[i].Content; {
		case strings.HasSuffix(im.Path, ".md"):
			out[i].Content = mine + "\n\n<!-- imported by smx from your own " + filepath.Base(im.Path) + " -->\n\n" + im.Content
		case strings.HasSuffix(im.Path, ".json"):
			out[i].Content = mergeJSON(im.Content, mine)
		case strings.HasSuffix(im.Path, ".toml"):
			out[i].Content = agentconf.MergeTOML(im.Content, mine)
		}
	}
	return out
}

// mergeJSON merges JSON object over into base (objects recursively, over's
// other values winning); either not an object gives over.
func mergeJSON(base, over string) string {
	var b, o map[string]any
	if json.Unmarshal([]byte(base), &b) != nil || json.Unmarshal([]byte(over), &o) != nil {
		return over
	}
	var merge func(b, o map[string]any)
	merge = func(b, o map[string]any) {
		for k, v := range o {
			bv, bok := b[k].(map[string]any)
			ov, ook := v.(map[string]any)
			if bok && ook {
				merge(bv, ov)
				continue
			}
			b[k] = v
		}
	}
	merge(b, o)
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false) // hook commands keep their && and >
	enc.SetIndent("", "  ")
	enc.Encode(b)
	return out.String()
}

// presetFiles copies the preset's files into the guest: placeholder
// sign-in configs and the agent's instructions file, and the user's
// imported configuration, owned by the preset's user when they are under
// its home.
func (s *Service) presetFiles(ctx context.Context, name string, p *preset.Preset, imported []preset.File) error {
	in, err := s.manager().Get(name)
	if err != nil {
		return err
	}
	instr := preset.Instructions(filepath.Base(in.Spec.Profile), profileSummary(s.manager().Paths(name).Profile()))
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	home := "/home/" + p.User + "/"
	owner := func(path string) (int, int) {
		if p.User != "" && p.User != "root" && strings.HasPrefix(path, home) {
			return int(p.UID), int(p.GID)
		}
		return 0, 0
	}
	now := time.Now()
	files := append(slices.Clone(p.Files), preset.File{Path: "/usr/local/bin/smx-why", Content: smxWhyScript})
	for i, f := range files {
		files[i].Content = strings.ReplaceAll(f.Content, preset.InstructionsMarker, instr)
	}
	files = mergeImported(files, imported)
	for _, f := range files {
		rel := strings.TrimPrefix(f.Path, "/")
		// Parent directories under the home first, so they get the user.
		parts := strings.Split(rel, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/")
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if uid, gid := owner("/" + d + "/"); "/"+d+"/" != home && strings.HasPrefix("/"+d+"/", home) {
				tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, Uid: uid, Gid: gid, ModTime: now})
			}
		}
		content := f.Content
		uid, gid := owner(f.Path)
		mode := int64(0o600)
		if strings.HasPrefix(content, "#!") || f.Exec {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: mode, Size: int64(len(content)),
			Uid: uid, Gid: gid, ModTime: now}); err != nil {
			return err
		}
		io.WriteString(tw, content)
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if _, err := s.client(name).CopyIn(ctx, "/", &buf); err != nil {
		return fmt.Errorf("preset %s: copy its files into the guest: %w", p.Name, err)
	}
	return nil
}

// smxWhyScript lists the sandbox's recent refusals, which the supervisor
// serves on the gateway address (supervisor.WhyPort).
var smxWhyScript = `#!/bin/sh
# smx-why: this sandbox's recent refusals, with the rules that made them,
# as the host-side gateway recorded them.
curl -fsS --max-time 10 http://10.0.2.2:` + strconv.Itoa(supervisor.WhyPort) + `/ && exit 0
echo "smx-why: the gateway did not answer" >&2
exit 1
`

// profileSummary describes a frozen profile for the agent's instructions:
// the profile's own YAML, rules and all (the agent reads YAML well).
func profileSummary(frozen string) string {
	b, err := os.ReadFile(frozen)
	if err != nil {
		return "(the profile could not be read)\n"
	}
	var lines []string
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if i := strings.Index(l, " # @ "); i >= 0 {
			l = l[:i]
		}
		lines = append(lines, "    "+l)
	}
	return strings.Join(lines, "\n") + "\n"
}
