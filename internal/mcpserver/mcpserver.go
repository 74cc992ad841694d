// Package mcpserver exposes sandboxes to an agent on the host as Model
// Context Protocol tools (`smx mcp`, JSON-RPC 2.0 over stdio): create,
// exec, cp, snapshot, fork, logs, rm, ls and ports. Each tool is one call of the
// same Backend the HTTP API serves, so the MCP server needs no daemon.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/tarfs"
)

// New returns an MCP server whose tools drive b. message words a failed
// tool's error for the agent (nil: the error's text).
func New(b api.Backend, version string, message func(error) string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "smx", Version: version}, nil)
	if message == nil {
		message = api.Message
	}
	t := tools{worded{b, message}}
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_create",
		Description: "Create a sandbox (a microVM with its own kernel, behind smx's host-side permission gateway) and boot it. Returns the sandbox."}, t.create)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_exec",
		Description: "Run a command in a running sandbox and return its exit code, stdout and stderr."}, t.exec)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_cp",
		Description: "Copy a file or directory between the host and a running sandbox: direction \"in\" copies host_path into guest_dir, \"out\" copies guest_path into host_dir."}, t.cp)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_snapshot",
		Description: "Snapshot a running sandbox (memory, processes and disk); it keeps running unless stop is set."}, t.snapshot)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_fork",
		Description: "Start a new sandbox from a snapshot, with its memory, processes and its own copy of the disk."}, t.fork)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_logs",
		Description: "Read a sandbox's tamper-evident log (optionally only refusals), or verify its hash chain and signatures."}, t.logs)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_rm",
		Description: "Stop and remove a sandbox (its log is kept)."}, t.rm)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_ls", Description: "List sandboxes and their status."}, t.ls)
	mcp.AddTool(s, &mcp.Tool{Name: "sandbox_ports",
		Description: "List, publish (add) or withdraw (rm) a sandbox's ports on the host, as `smx agent port`: a published guest TCP port is served on host loopback by the sandbox's supervisor (each connection recorded); on a running sandbox at once, otherwise from its next start. Returns the ports with the host port each is bound to now."}, t.ports)
	mcp.AddTool(s, &mcp.Tool{Name: "agent_run",
		Description: "Launch a coding agent preset (claude, codex, gemini, shell, docker) detached in a new sandbox on a host folder mounted at /work, under the preset's profile. The first launch of a preset builds its image (minutes; progress is sent as notifications when the caller asks for them). When the agent exits the sandbox stops; agent_inspect reports its exit code."}, t.agentRun)
	mcp.AddTool(s, &mcp.Tool{Name: "agent_inspect",
		Description: "Show a sandbox started by agent_run: its status, the agent's command line and, once it has exited, its exit code."}, t.agentInspect)
	mcp.AddTool(s, &mcp.Tool{Name: "approvals_list",
		Description: "List the requests sandboxes hold until the host user answers (a profile rule says ask): id, sandbox, channel, the exact thing asked, the rule and its place in the profile, and when it expires (then it is refused)."}, t.approvals)
	mcp.AddTool(s, &mcp.Tool{Name: "approval_answer",
		Description: "Answer a held request on the host user's behalf: deny, once (this request only), sandbox (for the sandbox's life) or always (writes the rule into the sandbox's profile file and reloads it). The answer is recorded in the sandbox's signed log as given through MCP."}, t.answer)
	return s
}

type tools struct{ b api.Backend }

type approvalsIn struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"only this sandbox"`
}

func (t tools) approvals(ctx context.Context, _ *mcp.CallToolRequest, in approvalsIn) (*mcp.CallToolResult, any, error) {
	l, err := t.b.Approvals(ctx, in.Sandbox)
	if err != nil {
		return nil, nil, err
	}
	if l == nil {
		l = []wire.Approval{}
	}
	return nil, wire.Approvals{Approvals: l}, nil
}

type answerIn struct {
	ID       string `json:"id" jsonschema:"the approval's id, from approvals_list"`
	Decision string `json:"decision" jsonschema:"deny, once, sandbox or always"`
}

func (t tools) answer(ctx context.Context, _ *mcp.CallToolRequest, in answerIn) (*mcp.CallToolResult, any, error) {
	a, err := t.b.Answer(context.WithoutCancel(ctx), in.ID, in.Decision, "mcp")
	if err != nil {
		return nil, nil, err
	}
	return nil, a, nil
}

// worded is a Backend whose errors carry the sentence a user acts on.
type worded struct {
	api.Backend
	msg func(error) string
}

type wordedError struct {
	err error
	msg string
}

func (e *wordedError) Error() string { return e.msg }
func (e *wordedError) Unwrap() error { return e.err }

func (w worded) word(err error) error {
	if err == nil {
		return nil
	}
	return &wordedError{err, w.msg(err)}
}

func (w worded) Create(ctx context.Context, req wire.CreateRequest) (*wire.Sandbox, error) {
	sb, err := w.Backend.Create(ctx, req)
	return sb, w.word(err)
}

func (w worded) Exec(ctx context.Context, name string, req wire.ExecRequest, sio api.ExecIO) (api.ExitStatus, error) {
	st, err := w.Backend.Exec(ctx, name, req, sio)
	return st, w.word(err)
}

func (w worded) CopyIn(ctx context.Context, name, dir string, tar io.Reader) (int64, error) {
	n, err := w.Backend.CopyIn(ctx, name, dir, tar)
	return n, w.word(err)
}

func (w worded) CopyFromGuest(ctx context.Context, name, src, dst string) (int64, error) {
	n, err := w.Backend.CopyFromGuest(ctx, name, src, dst)
	return n, w.word(err)
}

func (w worded) CopyOut(ctx context.Context, name, path string, wr io.Writer) error {
	return w.word(w.Backend.CopyOut(ctx, name, path, wr))
}

func (w worded) Snapshot(ctx context.Context, name string, req wire.SnapshotRequest) (*wire.Snapshot, error) {
	sn, err := w.Backend.Snapshot(ctx, name, req)
	return sn, w.word(err)
}

func (w worded) Fork(ctx context.Context, snap string, req wire.ForkRequest) (*wire.Sandbox, error) {
	sb, err := w.Backend.Fork(ctx, snap, req)
	return sb, w.word(err)
}

func (w worded) Logs(ctx context.Context, name string, q api.LogQuery, fn func(wire.Record) error) error {
	return w.word(w.Backend.Logs(ctx, name, q, fn))
}

func (w worded) VerifyLog(ctx context.Context, name string) (*wire.VerifyReport, error) {
	rep, err := w.Backend.VerifyLog(ctx, name)
	return rep, w.word(err)
}

func (w worded) Remove(ctx context.Context, name string, force bool) error {
	return w.word(w.Backend.Remove(ctx, name, force))
}

func (w worded) RunAgent(ctx context.Context, req wire.AgentRequest, progress func(wire.AgentEvent)) (*wire.Agent, error) {
	a, err := w.Backend.RunAgent(ctx, req, progress)
	return a, w.word(err)
}

func (w worded) Agent(ctx context.Context, name string) (*wire.Agent, error) {
	a, err := w.Backend.Agent(ctx, name)
	return a, w.word(err)
}

func (w worded) Ports(ctx context.Context, name string) (*wire.PortList, error) {
	l, err := w.Backend.Ports(ctx, name)
	return l, w.word(err)
}

func (w worded) AddPort(ctx context.Context, name string, req wire.PortRequest) (*wire.PortList, error) {
	l, err := w.Backend.AddPort(ctx, name, req)
	return l, w.word(err)
}

func (w worded) RemovePort(ctx context.Context, name, port string) (*wire.PortList, error) {
	l, err := w.Backend.RemovePort(ctx, name, port)
	return l, w.word(err)
}

func (w worded) List(ctx context.Context) ([]wire.Sandbox, error) {
	l, err := w.Backend.List(ctx)
	return l, w.word(err)
}

type createIn struct {
	Name     string `json:"name,omitempty" jsonschema:"sandbox name; generated when empty"`
	Image    string `json:"image,omitempty" jsonschema:"guest image (default busybox)"`
	Profile  string `json:"profile,omitempty" jsonschema:"security profile: locked, dev (default), open, or a name"`
	Memory   string `json:"memory,omitempty" jsonschema:"guest memory, e.g. 512M"`
	CPUs     int    `json:"cpus,omitempty" jsonschema:"virtual CPUs"`
	Timeout  string `json:"timeout,omitempty" jsonschema:"stop the sandbox once it has run this long, e.g. 30m (--timeout); forks keep it"`
	IdleStop string `json:"idle_stop,omitempty" jsonschema:"stop the sandbox after this long with no exec, flow or agent output, e.g. 10m (--idle-stop); forks keep it"`
}

func (t tools) create(ctx context.Context, _ *mcp.CallToolRequest, in createIn) (*mcp.CallToolResult, any, error) {
	sb, err := t.b.Create(ctx, wire.CreateRequest{Name: in.Name, Image: in.Image, Profile: in.Profile, Memory: in.Memory, CPUs: in.CPUs,
		Timeout: in.Timeout, IdleStop: in.IdleStop, Start: true})
	return nil, sb, err
}

type execIn struct {
	Sandbox string   `json:"sandbox" jsonschema:"sandbox name"`
	Command []string `json:"command" jsonschema:"program and arguments, e.g. [\"sh\",\"-c\",\"ls /\"]"`
	Stdin   string   `json:"stdin,omitempty" jsonschema:"data on the command's standard input"`
	Env     []string `json:"env,omitempty" jsonschema:"environment entries, each KEY=VALUE"`
	Workdir string   `json:"workdir,omitempty"`
	User    string   `json:"user,omitempty" jsonschema:"user name or uid[:gid] (default root)"`
	Timeout int      `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default 600)"`
}

type limited struct {
	b         strings.Builder
	truncated bool
}

func (l *limited) Write(p []byte) (int, error) {
	if room := wire.MaxExecOutput - l.b.Len(); len(p) > room {
		l.b.Write(p[:max(room, 0)])
		l.truncated = true
		return len(p), nil
	}
	return l.b.Write(p)
}

func (t tools) exec(ctx context.Context, _ *mcp.CallToolRequest, in execIn) (*mcp.CallToolResult, any, error) {
	if len(in.Command) == 0 {
		return nil, nil, fmt.Errorf("command is empty: give the program and its arguments")
	}
	timeout := 600 * time.Second
	if in.Timeout > 0 {
		timeout = time.Duration(in.Timeout) * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var stdout, stderr limited
	sio := api.ExecIO{Stdout: &stdout, Stderr: &stderr}
	if in.Stdin != "" {
		sio.Stdin = strings.NewReader(in.Stdin)
	}
	st, err := t.b.Exec(ctx, in.Sandbox, wire.ExecRequest{Args: in.Command, Env: in.Env, Dir: in.Workdir, User: in.User, Stdin: sio.Stdin != nil}, sio)
	var se *api.StartError
	if errors.As(err, &se) {
		// As a shell would: 127 not found, 126 not executable.
		return nil, wire.ExecResult{ExitCode: se.ExitCode, Stderr: err.Error() + "\n"}, nil
	}
	if err != nil {
		if ctx.Err() == context.DeadlineExceeded {
			return nil, nil, fmt.Errorf("command timed out after %s and was killed", timeout)
		}
		return nil, nil, err
	}
	return nil, wire.ExecResult{ExitCode: st.Code, Signal: st.Signal, Stdout: stdout.b.String(), Stderr: stderr.b.String(),
		Truncated: stdout.truncated || stderr.truncated}, nil
}

type cpIn struct {
	Sandbox   string `json:"sandbox"`
	Direction string `json:"direction" jsonschema:"in (host to sandbox) or out (sandbox to host)"`
	HostPath  string `json:"host_path" jsonschema:"in: the file or directory to copy; out: the host directory to copy into"`
	GuestPath string `json:"guest_path" jsonschema:"in: the guest directory to copy into; out: the guest file or directory to copy"`
}

type cpOut struct {
	Copied string `json:"copied"`
	Bytes  int64  `json:"bytes,omitempty"`
}

func (t tools) cp(ctx context.Context, _ *mcp.CallToolRequest, in cpIn) (*mcp.CallToolResult, any, error) {
	if !filepath.IsAbs(in.HostPath) || !strings.HasPrefix(in.GuestPath, "/") {
		return nil, nil, fmt.Errorf("host_path and guest_path must be absolute: %w", errdefs.ErrInvalid)
	}
	switch in.Direction {
	case "in":
		if _, err := os.Lstat(in.HostPath); err != nil {
			return nil, nil, err
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tarfs.Pack(pw, in.HostPath, filepath.Base(filepath.Clean(in.HostPath)))) }()
		n, err := t.b.CopyIn(ctx, in.Sandbox, in.GuestPath, pr)
		pr.Close()
		if err != nil {
			return nil, nil, err
		}
		return nil, cpOut{Copied: in.HostPath + " -> " + in.Sandbox + ":" + in.GuestPath, Bytes: n}, nil
	case "out":
		if fi, err := os.Stat(in.HostPath); err != nil || !fi.IsDir() {
			return nil, nil, fmt.Errorf("host_path %s must be an existing directory: %w", in.HostPath, errdefs.ErrInvalid)
		}
		// The same checked entry point as smx agent cp: the host names
		// what lands, and the guest's stream is refused if it names more.
		n, err := t.b.CopyFromGuest(ctx, in.Sandbox, in.GuestPath, in.HostPath)
		if err != nil {
			return nil, nil, err
		}
		return nil, cpOut{Copied: in.Sandbox + ":" + in.GuestPath + " -> " + in.HostPath, Bytes: n}, nil
	}
	return nil, nil, fmt.Errorf("direction %q: use in or out: %w", in.Direction, errdefs.ErrInvalid)
}

type snapshotIn struct {
	Sandbox string `json:"sandbox"`
	Name    string `json:"name,omitempty" jsonschema:"snapshot name (default SANDBOX-DATE-TIME)"`
	Stop    bool   `json:"stop,omitempty" jsonschema:"stop the sandbox afterwards"`
}

func (t tools) snapshot(ctx context.Context, _ *mcp.CallToolRequest, in snapshotIn) (*mcp.CallToolResult, any, error) {
	sn, err := t.b.Snapshot(ctx, in.Sandbox, wire.SnapshotRequest{Name: in.Name, Stop: in.Stop})
	return nil, sn, err
}

type forkIn struct {
	Snapshot string `json:"snapshot"`
	Name     string `json:"name" jsonschema:"name of the new sandbox"`
	Profile  string `json:"profile,omitempty" jsonschema:"security profile (default: the snapshot's)"`
	Timeout  string `json:"timeout,omitempty" jsonschema:"replaces the timeout the fork keeps from its source, e.g. 30m; 0 removes it"`
	IdleStop string `json:"idle_stop,omitempty" jsonschema:"replaces the idle_stop the fork keeps from its source; 0 removes it"`
}

func (t tools) fork(ctx context.Context, _ *mcp.CallToolRequest, in forkIn) (*mcp.CallToolResult, any, error) {
	sb, err := t.b.Fork(ctx, in.Snapshot, wire.ForkRequest{Name: in.Name, Profile: in.Profile, Timeout: in.Timeout, IdleStop: in.IdleStop})
	return nil, sb, err
}

type logsIn struct {
	Sandbox  string `json:"sandbox"`
	Refusals bool   `json:"refusals,omitempty" jsonschema:"only what policy refused"`
	Verify   bool   `json:"verify,omitempty" jsonschema:"verify the hash chain, Merkle tree and signed checkpoints instead of reading"`
	Last     int    `json:"last,omitempty" jsonschema:"only the last N records (default 200)"`
}

func (t tools) logs(ctx context.Context, _ *mcp.CallToolRequest, in logsIn) (*mcp.CallToolResult, any, error) {
	if in.Verify {
		rep, err := t.b.VerifyLog(ctx, in.Sandbox)
		return nil, rep, err
	}
	last := in.Last
	if last <= 0 {
		last = 200
	}
	var recs []wire.Record
	err := t.b.Logs(ctx, in.Sandbox, api.LogQuery{Refusals: in.Refusals}, func(r wire.Record) error {
		recs = append(recs, r)
		if len(recs) > last {
			recs = recs[1:]
		}
		return nil
	})
	return nil, map[string]any{"records": recs}, err
}

type rmIn struct {
	Sandbox string `json:"sandbox"`
}

func (t tools) rm(ctx context.Context, _ *mcp.CallToolRequest, in rmIn) (*mcp.CallToolResult, any, error) {
	if err := t.b.Remove(ctx, in.Sandbox, true); err != nil {
		return nil, nil, err
	}
	return nil, map[string]string{"removed": in.Sandbox}, nil
}

func (t tools) ls(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
	l, err := t.b.List(ctx)
	if l == nil {
		l = []wire.Sandbox{}
	}
	return nil, map[string]any{"sandboxes": l}, err
}

type portsIn struct {
	Sandbox string `json:"sandbox"`
	Action  string `json:"action,omitempty" jsonschema:"ls (default), add or rm"`
	Port    string `json:"port,omitempty" jsonschema:"add: [HOSTIP:]HOSTPORT:GUESTPORT[/tcp] as docker's -p (HOSTIP defaults to 127.0.0.1, HOSTPORT 0 picks a free port); rm: that, or [HOSTIP:]HOSTPORT as bound"`
	// Publishing beyond loopback is the user's choice (`smx agent port
	// add --publish-external`), not the calling agent's: no field for it.
}

func (t tools) ports(ctx context.Context, _ *mcp.CallToolRequest, in portsIn) (*mcp.CallToolResult, any, error) {
	var l *wire.PortList
	var err error
	switch in.Action {
	case "", "ls":
		l, err = t.b.Ports(ctx, in.Sandbox)
	case "add", "rm":
		if in.Port == "" {
			return nil, nil, fmt.Errorf("sandbox_ports %s needs port, e.g. 8080:8000: %w", in.Action, errdefs.ErrInvalid)
		}
		if in.Action == "add" {
			l, err = t.b.AddPort(ctx, in.Sandbox, wire.PortRequest{Port: in.Port})
		} else {
			l, err = t.b.RemovePort(ctx, in.Sandbox, in.Port)
		}
	default:
		return nil, nil, fmt.Errorf("sandbox_ports: action %q: want ls, add or rm: %w", in.Action, errdefs.ErrInvalid)
	}
	if err != nil {
		return nil, nil, err
	}
	return nil, l, nil
}

type agentRunIn struct {
	Preset       string   `json:"preset" jsonschema:"claude, codex, gemini, shell, docker, or a preset in ~/.config/smx/presets"`
	Workspace    string   `json:"workspace" jsonschema:"absolute host folder mounted at /work (the repository to work on)"`
	Args         []string `json:"args,omitempty" jsonschema:"arguments appended to the agent's command line"`
	Name         string   `json:"name,omitempty" jsonschema:"sandbox name; generated when empty"`
	Profile      string   `json:"profile,omitempty" jsonschema:"base profile under the preset's credentials (default dev)"`
	Memory       string   `json:"memory,omitempty" jsonschema:"guest memory (default 2G)"`
	Remove       bool     `json:"remove,omitempty" jsonschema:"remove the sandbox once the agent exits"`
	Timeout      string   `json:"timeout,omitempty" jsonschema:"stop the agent's sandbox once it has run this long, e.g. 2h (--timeout)"`
	IdleStop     string   `json:"idle_stop,omitempty" jsonschema:"stop it after this long with no exec, flow or agent output, e.g. 15m (--idle-stop)"`
	ImportConfig bool     `json:"import_config,omitempty" jsonschema:"copy the user's own settings, instructions, sub-agents, commands, skills, hooks and MCP servers of the agent (never sign-ins, keys or history) into the guest (--import-config)"`
	Docker       bool     `json:"docker,omitempty" jsonschema:"add Docker Engine to the preset: dockerd in the guest, the public registries allowed (--docker)"`
}

func (t tools) agentRun(ctx context.Context, req *mcp.CallToolRequest, in agentRunIn) (*mcp.CallToolResult, any, error) {
	// Progress goes out as MCP progress notifications when the caller
	// gave a progress token (image builds take minutes).
	var progress func(wire.AgentEvent)
	if req != nil && req.Params != nil && req.Session != nil {
		if tok := req.Params.GetProgressToken(); tok != nil {
			n := 0.0
			progress = func(ev wire.AgentEvent) {
				n++
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: n, Message: ev.Stage + ": " + ev.Message})
			}
		}
	}
	a, err := t.b.RunAgent(ctx, wire.AgentRequest{Preset: in.Preset, Workspace: in.Workspace, Args: in.Args, Name: in.Name,
		Profile: in.Profile, Memory: in.Memory, Remove: in.Remove, Timeout: in.Timeout, IdleStop: in.IdleStop, ImportConfig: in.ImportConfig, Docker: in.Docker}, progress)
	return nil, a, err
}

type agentInspectIn struct {
	Sandbox string `json:"sandbox" jsonschema:"sandbox name"`
}

func (t tools) agentInspect(ctx context.Context, _ *mcp.CallToolRequest, in agentInspectIn) (*mcp.CallToolResult, any, error) {
	a, err := t.b.Agent(ctx, in.Sandbox)
	return nil, a, err
}
