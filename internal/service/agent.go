package service

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/preset"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
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
	// Caches are CreateRequest's (--volume-cache), owned by the preset
	// user, ~ its home.
	Caches []string `json:"caches,omitempty"`
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
	// Docker adds Docker Engine to the preset (preset.WithDocker): the
	// docker preset's packages, its dockerd and its registries' names.
	Docker bool `json:"-"`
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
	// Services are the preset's daemons (dockerd), started again when the
	// sandbox boots afresh.
	Services []preset.Service `json:"services,omitempty"`
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
// fix, not fatal), "create", "start", "service" (a preset's daemon, such
// as dockerd, starts) or "agent".
type AgentProgress struct {
	Stage   string `json:"stage"`
	Message string `json:"message"`
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
	if req.Docker {
		if p, err = p.WithDocker(); err != nil {
			return nil, err
		}
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
		Ports: req.Ports, PublishExternal: req.PublishExternal, Timeout: req.Timeout, IdleStop: req.IdleStop, worktree: wt,
		Caches: req.Caches, cacheOwner: &cacheOwner{Home: guestHome(p), UID: p.UID, GID: p.GID}}
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
		Command: append(slices.Clone(p.Command), req.Args...), Term: term, Remove: req.Remove, Services: p.Services}
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
	if _, err := s.Start(ctx, StartRequest{Name: name, Cold: req.Cold, noServices: true}); err != nil {
		return fail(err)
	}
	if err := s.presetFiles(ctx, name, p, imported); err != nil {
		return fail(err)
	}
	if err := s.startServices(ctx, name, p.Name, p.Services, progress); err != nil {
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
