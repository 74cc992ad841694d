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
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/smx-dev/smx/internal/agentconf"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/image"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/preset"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/supervisor"
)

// The agent of a preset runs under dtach in the guest: its master holds
// the agent's terminal, so the agent keeps running while nobody is
// attached, and an attach is a dtach client on a guest PTY. Detaching
// closes that client's exec stream (the guest kills the client, never the
// master). The wrapper records the agent's exit status in the guest
// (written aside, then renamed, so a reader never sees half of it).
const (
	AgentSocket   = "/tmp/.smx-agent.sock"
	agentExitFile = "/tmp/.smx-agent.exit"
	agentFile     = "preset.json" // in the sandbox directory
)

// AgentRequest describes a coding agent to launch from a preset. Zero
// fields take the defaults.
type AgentRequest struct {
	Preset string `json:"preset"`
	// Workspace is the host folder mounted at the preset's workdir
	// (/work), its files shown as the preset user's.
	Workspace string   `json:"workspace"`
	Args      []string `json:"args,omitempty"` // appended to the preset's command
	Name      string   `json:"name,omitempty"` // default: generated
	// Profile, when set, is the base under the preset's credential
	// bindings instead of dev: its rules, the preset's credentials.
	Profile string `json:"profile,omitempty"`
	CPUs    int    `json:"cpus,omitempty"`
	Memory  string `json:"memory,omitempty"` // default 2G
	Disk    string `json:"disk,omitempty"`   // default 16G
	Accel   string `json:"accel,omitempty"`
	// Mounts are extra host folders in -v notation; they too show as the
	// preset user's unless they name their own owner.
	Mounts []string `json:"mounts,omitempty"`
	// Ports and PublishExternal are CreateRequest's.
	Ports           []string `json:"ports,omitempty"`
	PublishExternal bool     `json:"publish_external,omitempty"`
	// Timeout and IdleStop are CreateRequest's (--timeout, --idle-stop).
	Timeout  string `json:"timeout,omitempty"`
	IdleStop string `json:"idle_stop,omitempty"`
	Cold     bool   `json:"cold,omitempty"`
	// Worktree, when set, runs the agent in its own Git worktree of the
	// repository at Workspace, on branch agent/NAME, made under
	// WorktreeDir (default: the state dir) or reused: see worktree.go.
	Worktree    string `json:"worktree,omitempty"`
	WorktreeDir string `json:"worktree_dir,omitempty"`
	// Term is the agent's TERM (default xterm-256color).
	Term string `json:"term,omitempty"`
	// Remove deletes the sandbox once the agent has exited (--rm).
	Remove bool `json:"remove,omitempty"`
	// Attach leaves the agent unstarted: the caller starts it and
	// attaches in one exec (AgentExec with create), so an agent that ends
	// at once is still seen. Everything else (the watch that stops the
	// sandbox when the agent exits) is the same.
	Attach bool `json:"-"`
	// ImportConfig copies the host user's own configuration of the
	// preset's agent (agentconf's allow-list: settings, instructions,
	// sub-agents, commands, skills, hooks, MCP server definitions; never
	// sign-ins, keys or history) into the guest user's home at start.
	ImportConfig bool `json:"-"`
}

// AgentRecord is what RunAgent leaves beside a sandbox's spec: what runs
// in it and, once it has ended, how.
type AgentRecord struct {
	Preset    string   `json:"preset"`
	Workspace string   `json:"workspace,omitempty"`
	User      string   `json:"user,omitempty"`
	Workdir   string   `json:"workdir,omitempty"`
	Command   []string `json:"command"`
	Term      string   `json:"term,omitempty"`
	Remove    bool     `json:"remove,omitempty"`
	// ExitCode is the agent's exit status once it has ended (128+N when
	// signal N killed it); nil while it runs.
	ExitCode *int       `json:"exit_code,omitempty"`
	Exited   *time.Time `json:"exited,omitempty"`
}

// Agent is a sandbox that runs a preset's agent.
type Agent struct {
	Sandbox
	Agent AgentRecord `json:"agent"`
}

// AgentProgress is one step of RunAgent. Stage is "image" (a build
// starts: Message says which, and that it takes minutes), "build" (one
// line of the image build's output), "warning" (something the user should
// fix, not fatal), "create", "start" or "agent".
type AgentProgress struct {
	Stage   string `json:"stage"`
	Message string `json:"message"`
}

// GetPreset returns preset name, a user's own (in preset.UserDir())
// winning over a shipped one.
func (s *Service) GetPreset(name string) (*preset.Preset, error) {
	return preset.Get(name, preset.UserDir())
}

// RunAgent launches a preset's agent on a workspace: it builds the
// preset's image unless the store has it (minutes, reported line by line
// through progress), creates a sandbox with the preset's profile,
// credential, environment and mounts, boots it, copies the preset's files
// (placeholder sign-ins, the instructions file) into the guest and starts
// the agent on a terminal under dtach, detached. A watcher process on the
// host then waits for the agent to exit: it records the exit status
// (AgentRecord.ExitCode, the log's run.end), stops the sandbox and, with
// Remove, deletes it, as a container runtime does when a container's main
// process exits. progress may be nil; it is called from this goroutine.
//
// A sandbox that was created but could not start is kept (the error says
// how to remove it), unless Remove is set.
func (s *Service) RunAgent(ctx context.Context, req AgentRequest, progress func(AgentProgress)) (*Agent, error) {
	if progress == nil {
		progress = func(AgentProgress) {}
	}
	p, err := s.GetPreset(req.Preset)
	if err != nil {
		return nil, err
	}
	// Bad -p before an image build that can take minutes.
	if _, err := publish.ParsePorts(req.Ports, req.PublishExternal); err != nil {
		return nil, err
	}
	if _, err := sandbox.ParseLimit("--timeout", req.Timeout); err != nil {
		return nil, err
	}
	if _, err := sandbox.ParseLimit("--idle-stop", req.IdleStop); err != nil {
		return nil, err
	}
	if p, err = s.presetSignIn(p, progress); err != nil {
		return nil, err
	}
	imported, err := importConfig(p, req.ImportConfig, progress)
	if err != nil {
		return nil, err
	}
	if req.Workspace == "" {
		return nil, fmt.Errorf("no workspace given: name the repository's folder: %w", errdefs.ErrInvalid)
	}
	work, err := filepath.Abs(req.Workspace)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(work); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("workspace %s is not a folder: give the repository's folder: %w", work, errdefs.ErrInvalid)
	}
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	img, err := s.PresetImage(ctx, p, progress)
	if err != nil {
		return nil, err
	}
	profRef, err := s.presetProfile(p, req.Profile)
	if err != nil {
		return nil, err
	}
	guestWork := p.Workdir
	if guestWork == "" {
		guestWork = "/work"
	}
	// The workspace's files show as the preset user's (fsgw maps the host
	// user to it), so an unprivileged agent can edit them. Extra mounts
	// too, unless they name their own owner.
	var wt *sandbox.Worktree
	if req.Worktree != "" {
		if wt, err = s.prepareWorktree(ctx, work, req.Worktree, req.WorktreeDir); err != nil {
			return nil, err
		}
		work = wt.Path
	}
	mounts := []string{OwnedMount(work+":"+guestWork, p.UID, p.GID)}
	if wt != nil {
		// The repository's .git at its own path, for the worktree's
		// gitfile; narrowed to the branch by the supervisor.
		mounts = append(mounts, OwnedMount(wt.GitDir+":"+wt.GitDir, p.UID, p.GID))
	}
	for _, m := range req.Mounts {
		mounts = append(mounts, OwnedMount(m, p.UID, p.GID))
	}
	creq := CreateRequest{Name: req.Name, Image: img.Name, Profile: profRef, CPUs: req.CPUs,
		Memory: req.Memory, Disk: req.Disk, Accel: req.Accel, Env: p.EnvList(), Mounts: mounts,
		Ports: req.Ports, PublishExternal: req.PublishExternal, Timeout: req.Timeout, IdleStop: req.IdleStop, worktree: wt}
	if creq.Memory == "" {
		creq.Memory = "2G"
	}
	if creq.Disk == "" {
		creq.Disk = "16G"
	}
	progress(AgentProgress{Stage: "create", Message: "creating the sandbox for " + p.Name})
	sb, err := s.Create(ctx, creq)
	if err != nil {
		return nil, err
	}
	name := sb.Spec.Name
	term := req.Term
	if term == "" {
		term = "xterm-256color"
	}
	rec := AgentRecord{Preset: p.Name, Workspace: work, User: p.User, Workdir: guestWork,
		Command: append(slices.Clone(p.Command), req.Args...), Term: term, Remove: req.Remove}
	fail := func(err error) (*Agent, error) {
		if req.Remove {
			s.Remove(context.WithoutCancel(ctx), RemoveRequest{Name: name, Force: true})
			return nil, err
		}
		return nil, fmt.Errorf("%w (the sandbox %s is kept: `smx agent rm -f %s` removes it)", err, name, name)
	}
	if err := s.writeAgentRecord(name, &rec); err != nil {
		return fail(err)
	}
	progress(AgentProgress{Stage: "start", Message: "booting sandbox " + name})
	if _, err := s.Start(ctx, StartRequest{Name: name, Cold: req.Cold}); err != nil {
		return fail(err)
	}
	if err := s.presetFiles(ctx, name, p, imported); err != nil {
		return fail(err)
	}
	if !req.Attach {
		progress(AgentProgress{Stage: "agent", Message: "starting " + strings.Join(rec.Command, " ")})
		if err := s.startAgent(ctx, name, &rec); err != nil {
			return fail(err)
		}
	}
	if err := s.spawnAgentWatch(name); err != nil {
		return fail(err)
	}
	return s.Agent(ctx, name)
}

// Agent returns sandbox name with the agent RunAgent started in it
// (errdefs.ErrNotFound for a sandbox that runs none).
func (s *Service) Agent(ctx context.Context, name string) (*Agent, error) {
	in, err := s.manager().Get(name)
	if err != nil {
		return nil, err
	}
	rec, err := s.AgentRecord(name)
	if err != nil {
		return nil, err
	}
	return &Agent{Sandbox: s.summary(*in), Agent: *rec}, nil
}

// AgentRecord reads what RunAgent recorded for sandbox name.
func (s *Service) AgentRecord(name string) (*AgentRecord, error) {
	if err := sandbox.ValidName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(s.manager().Paths(name).Dir, agentFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("sandbox %s runs no agent of `smx agent run`: use `smx agent shell %s`: %w", name, name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	var r AgentRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("sandbox %s: %s: %v: %w", name, agentFile, err, errdefs.ErrFailed)
	}
	return &r, nil
}

var agentRecordMu sync.Mutex

func (s *Service) writeAgentRecord(name string, rec *AgentRecord) error {
	agentRecordMu.Lock()
	defer agentRecordMu.Unlock()
	js, _ := json.MarshalIndent(rec, "", "  ")
	return statedir.WriteFileAtomic(filepath.Join(s.manager().Paths(name).Dir, agentFile), append(js, '\n'), 0o644)
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

// OwnedMount adds uid=UID,gid=GID to mount m in -v notation when it names
// no owner of its own (and the ids are not root's, the default). A mount
// that does not parse is left for Create to refuse with its reason.
func OwnedMount(m string, uid, gid uint32) string {
	if uid == 0 && gid == 0 {
		return m
	}
	opts := fmt.Sprintf("uid=%d,gid=%d", uid, gid)
	switch parts := strings.Split(m, ":"); {
	case len(parts) == 2:
		return m + ":" + opts
	case len(parts) == 3 && !strings.Contains(parts[2], "uid=") && !strings.Contains(parts[2], "gid="):
		return m + "," + opts
	}
	return m
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

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

// agentWrapper runs the agent's command line and records its exit status.
const agentWrapper = `rm -f ` + agentExitFile + `; "$@"; echo $? > ` + agentExitFile + `.new; mv ` + agentExitFile + `.new ` + agentExitFile

// AgentExec is the exec request that attaches a terminal to the agent in
// sandbox name: a dtach client of its master, or, with create, the one
// exec that starts the agent and attaches to it.
func AgentExec(name string, rec *AgentRecord, create bool) ExecRequest {
	args := []string{"dtach", "-a", AgentSocket, "-E", "-z", "-r", "winch"}
	if create {
		args = append([]string{"dtach", "-c"}, agentMaster(rec)[2:]...)
	}
	return ExecRequest{Name: name, Args: args, Env: agentEnv(rec), Dir: rec.Workdir,
		User: rec.User, TTY: true, Size: &WindowSize{Rows: 24, Cols: 80}, Label: "attach"}
}

// AgentPlainExec is the exec request that starts the agent in sandbox
// name with no terminal, as `docker run` without -t runs a container: its
// stdout and stderr apart and as it writes them (no terminal redraws, its
// own line ends). No dtach master holds it, so nobody detaches from or
// attaches to it; the wrapper still records its exit status for the
// watcher and AgentExit.
func AgentPlainExec(name string, rec *AgentRecord) ExecRequest {
	return ExecRequest{Name: name, Args: append([]string{"/bin/sh", "-c", agentWrapper, "agent"}, rec.Command...),
		Env: agentEnv(rec)[1:], Dir: rec.Workdir, User: rec.User, Label: "agent"} // no TERM: there is no terminal
}

// agentMaster is the dtach command that starts the agent detached.
func agentMaster(rec *AgentRecord) []string {
	return append([]string{"dtach", "-n", AgentSocket, "-E", "-z", "-r", "winch", "/bin/sh", "-c", agentWrapper, "agent"}, rec.Command...)
}

func agentEnv(rec *AgentRecord) []string {
	term := rec.Term
	if term == "" {
		term = "xterm-256color"
	}
	env := []string{"TERM=" + term, "HOME=/home/" + rec.User}
	if rec.User == "" || rec.User == "root" {
		env[1] = "HOME=/root"
	}
	return env
}

// startAgent starts the agent under a dtach master in the guest.
func (s *Service) startAgent(ctx context.Context, name string, rec *AgentRecord) error {
	var out bytes.Buffer
	st, err := s.Exec(ctx, ExecRequest{Name: name, Args: agentMaster(rec), Env: agentEnv(rec), Dir: rec.Workdir, User: rec.User, Label: "agent"},
		ExecIO{Stdout: &out, Stderr: &out})
	if err != nil {
		return err
	}
	if st.Code != 0 {
		return fmt.Errorf("starting the agent failed (exit %d): %s: %w", st.Code, strings.TrimSpace(out.String()), errdefs.ErrFailed)
	}
	return nil
}

// spawnAgentWatch starts the host process that waits for the agent's end
// (`smx __agent-wait NAME`, which calls WaitAgent): detached, in its own
// session, so it outlives the caller as the supervisor does. It ends when
// the agent does or when the sandbox stops or goes away.
func (s *Service) spawnAgentWatch(name string) error {
	argv := append([]string(nil), s.Supervisor...)
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		argv = []string{exe}
	}
	argv = append(argv, "__agent-wait", name)
	dir := s.manager().Paths(name).Dir
	logf, err := os.OpenFile(filepath.Join(dir, "agent-wait.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "SMX_HOME="+s.state.Root)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("sandbox %s: start the agent's watcher: %w", name, err)
	}
	// Reap it if it ends while we live; once we exit, init adopts it.
	go cmd.Wait()
	return nil
}

// agentWaiter is the guest command whose exit status is the agent's: it
// waits for the wrapper's status file. It is labelled "agent-wait": the
// log records it as the sandbox's main command (run.start, then run.end
// with the agent's exit_code), and --idle-stop does not count it as
// activity; its arguments name the agent's command line.
func agentWaiter(rec *AgentRecord) []string {
	script := `while [ ! -e ` + agentExitFile + ` ]; do sleep 1; done; exit "$(cat ` + agentExitFile + `)"`
	return append([]string{"/bin/sh", "-c", script, "agent"}, rec.Command...)
}

// WaitAgent is the watcher's work (`smx __agent-wait NAME`): it waits for
// the agent in sandbox name to exit, records its status, stops the
// sandbox and, when the agent was run with Remove, deletes it. A sandbox
// that stops, is suspended or goes away first ends the wait; with Remove
// the stopped sandbox is still deleted (as `docker stop` does to a --rm
// container). A snapshot or a pause does not end it.
func (s *Service) WaitAgent(ctx context.Context, name string) error {
	rec, err := s.AgentRecord(name)
	if err != nil {
		return err
	}
	var st *ExitStatus
	for {
		st, err = s.Exec(ctx, ExecRequest{Name: name, Args: agentWaiter(rec), Label: "agent-wait"}, ExecIO{})
		if err == nil && st.Signal == 0 {
			break
		}
		if _, ok := CommandExitCode(err); ok {
			return err // no shell in the guest: nothing to wait with
		}
		// While the sandbox lives, a cut wait is started again: the
		// stream is only as durable as the control session (a snapshot
		// keeps it today, measured: one run.start across a snapshot
		// in TestAgentExit), and a paused sandbox refuses new execs.
		if in, gerr := s.manager().Get(name); gerr == nil && ctx.Err() == nil {
			switch in.State.Status {
			case sandbox.StatusRunning, sandbox.StatusPaused, sandbox.StatusBlocked:
				time.Sleep(time.Second)
				continue
			}
		}
		// The sandbox went down under the wait (stopped, suspended,
		// removed, crashed): the agent's end is not known.
		if rec.Remove {
			s.removeWhenDown(ctx, name)
		}
		return err
	}
	code, now := st.Code, time.Now().UTC()
	rec.ExitCode, rec.Exited = &code, &now
	if err := s.writeAgentRecord(name, rec); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.warn("sandbox %s: record the agent's exit status: %v", name, err)
	}
	if _, err := s.Stop(ctx, StopRequest{Name: name, Timeout: 10 * time.Second}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if rec.Remove {
		if err := s.Remove(ctx, RemoveRequest{Name: name, Force: true}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
	}
	return nil
}

// removeWhenDown deletes sandbox name once it is no longer live (a stop
// in progress finishes first); it gives up after a minute or when the
// sandbox is started again.
func (s *Service) removeWhenDown(ctx context.Context, name string) {
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		in, err := s.manager().Get(name)
		if err != nil {
			return
		}
		switch in.State.Status {
		case sandbox.StatusStopped, sandbox.StatusCrashed, sandbox.StatusCreated:
			s.Remove(ctx, RemoveRequest{Name: name})
			return
		}
	}
}

// AgentExit is the exit status of the agent in sandbox name once it has
// ended: from the guest's status file while the sandbox runs, else from
// the record or the log's run.end (which stays after the sandbox is
// removed). It waits up to wait for the status to be known.
func (s *Service) AgentExit(ctx context.Context, name string, wait time.Duration) (int, bool) {
	since := time.Time{}
	for end := time.Now().Add(wait); ; {
		var out bytes.Buffer
		if st, err := s.Exec(ctx, ExecRequest{Name: name, Args: []string{"cat", agentExitFile}}, ExecIO{Stdout: &out, Stderr: io.Discard}); err == nil && st.Code == 0 {
			if n, err := strconv.Atoi(strings.TrimSpace(out.String())); err == nil {
				return n, true
			}
		}
		if rec, err := s.AgentRecord(name); err == nil && rec.ExitCode != nil {
			return *rec.ExitCode, true
		}
		if in, err := s.manager().Get(name); err == nil {
			since = in.Spec.Created
		}
		if code, ok := s.loggedAgentExit(name, since); ok {
			return code, true
		}
		if time.Now().After(end) || ctx.Err() != nil {
			return 0, false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// loggedAgentExit is the exit_code of the last run.end in sandbox name's
// log at or after since.
func (s *Service) loggedAgentExit(name string, since time.Time) (int, bool) {
	code, ok := 0, false
	audit.Scan(audit.Dir(s.state.Logs(), name), audit.Filter{Since: since}, func(r audit.Record) error {
		switch r.Kind {
		case audit.KindSandboxCreate:
			ok = false
		case audit.KindRunEnd:
			switch n := r.Fields["exit_code"].(type) {
			case float64:
				code, ok = int(n), true
			case json.Number:
				if i, err := n.Int64(); err == nil {
					code, ok = int(i), true
				}
			}
		}
		return nil
	})
	return code, ok
}
