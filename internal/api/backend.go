// Package api serves smx's local HTTP API (`smx serve`): JSON over a unix
// socket (or TCP with a bearer token), exec over a WebSocket, file copy as
// tar, logs and events as JSON lines. It depends only on Backend, the
// operations of the host service, so the CLI, this server and the MCP
// server are all thin callers of one implementation. The wire types live
// in the public package smx/api (imported here as wire); the route table
// is checked against api/openapi.yaml by the tests.
package api

import (
	"context"
	"io"
	"time"

	wire "github.com/smx-dev/smx/api"
)

// Backend is every operation the API exposes. Implementations are safe for
// concurrent use; every call takes the request's context, and a call whose
// context ends stops (an exec's guest process is killed). Errors carry an
// errdefs class (errors.Is), which decides the HTTP status.
type Backend interface {
	Images(ctx context.Context) ([]wire.Image, error)
	// BuildImage builds or imports an image; cancelling ctx leaves
	// nothing behind.
	BuildImage(ctx context.Context, req wire.ImageRequest) (*wire.Image, error)
	InspectImage(ctx context.Context, name string) (*wire.Image, error)
	// RemoveImage refuses (in use) while a sandbox or snapshot needs it.
	RemoveImage(ctx context.Context, name string) error

	List(ctx context.Context) ([]wire.Sandbox, error)
	// Inspect returns the sandbox with its QEMU command line.
	Inspect(ctx context.Context, name string) (*wire.Sandbox, error)
	Create(ctx context.Context, req wire.CreateRequest) (*wire.Sandbox, error)
	Start(ctx context.Context, name string, cold bool) (*wire.Sandbox, error)
	Stop(ctx context.Context, name string, timeout time.Duration) (*wire.Sandbox, error)
	// Remove deletes a sandbox; force stops a running one first.
	Remove(ctx context.Context, name string, force bool) error
	Pause(ctx context.Context, name string) (*wire.Sandbox, error)
	Resume(ctx context.Context, name string) (*wire.Sandbox, error)
	Suspend(ctx context.Context, name string) (*wire.Sandbox, error)

	// Exec runs a process and returns how it ended once all its output is
	// written. A command that cannot start is a *StartError.
	Exec(ctx context.Context, name string, req wire.ExecRequest, sio ExecIO) (ExitStatus, error)
	// CopyIn extracts a tar stream into directory dir of the guest.
	CopyIn(ctx context.Context, name, dir string, tar io.Reader) (int64, error)
	// CopyOut writes a tar stream of path in the guest (top entry: its
	// base name).
	CopyOut(ctx context.Context, name, path string, w io.Writer) error
	// CopyFromGuest copies path src of the guest to host path dst
	// through tarfs's checks (service.CopyFromGuest) and returns the
	// bytes written. No route serves it: the host is the caller's.
	CopyFromGuest(ctx context.Context, name, src, dst string) (int64, error)

	Snapshot(ctx context.Context, name string, req wire.SnapshotRequest) (*wire.Snapshot, error)
	Snapshots(ctx context.Context) ([]wire.Snapshot, error)
	GetSnapshot(ctx context.Context, name string, verify bool) (*wire.Snapshot, error)
	RemoveSnapshot(ctx context.Context, name string) error
	// Fork creates and starts a sandbox from a snapshot.
	Fork(ctx context.Context, snapshot string, req wire.ForkRequest) (*wire.Sandbox, error)

	Profiles(ctx context.Context) ([]wire.Profile, error)
	ShowProfile(ctx context.Context, ref string) (*wire.Profile, error)
	CheckProfile(ctx context.Context, req wire.CheckRequest) (*wire.CheckResult, error)
	Explain(ctx context.Context, ref, request string) (*wire.Explanation, error)
	// SandboxProfile is the profile frozen into a sandbox, the one its
	// gateways enforce; ExplainSandbox decides request against it.
	SandboxProfile(ctx context.Context, name string) (*wire.Profile, error)
	ExplainSandbox(ctx context.Context, name, request string) (*wire.Explanation, error)

	// Approvals lists the questions pending in sandbox ("" = all);
	// Answer answers one (service.AnswerApproval), by naming the
	// interface ("api", "console").
	Approvals(ctx context.Context, sandbox string) ([]wire.Approval, error)
	Answer(ctx context.Context, id, decision, by string) (*wire.Approval, error)
	// SetPolicy freezes profile ref into the sandbox; a live one (running
	// or paused) applies it at once.
	SetPolicy(ctx context.Context, name, ref string) (*wire.PolicyResult, error)

	// Ports lists a sandbox's published ports; AddPort publishes one
	// and RemovePort withdraws one ([HOSTIP:]HOSTPORT[:GUESTPORT]), at
	// once on a live sandbox, from the next start otherwise.
	Ports(ctx context.Context, name string) (*wire.PortList, error)
	AddPort(ctx context.Context, name string, req wire.PortRequest) (*wire.PortList, error)
	RemovePort(ctx context.Context, name, port string) (*wire.PortList, error)

	// AddMount mounts a host folder in a running sandbox (over its
	// virtio-fs device); RemoveMount unmounts the one at a guest path and
	// drops it on the host.
	AddMount(ctx context.Context, name string, req wire.MountRequest) (*wire.MountList, error)
	RemoveMount(ctx context.Context, name, guest string) (*wire.MountList, error)

	// RunAgent launches a preset's agent (service.RunAgent): progress is
	// called with each "progress" event, from the calling goroutine or
	// the image build's.
	RunAgent(ctx context.Context, req wire.AgentRequest, progress func(wire.AgentEvent)) (*wire.Agent, error)
	// Agent returns a sandbox that runs a preset's agent.
	Agent(ctx context.Context, name string) (*wire.Agent, error)

	// Credentials lists the host-side secrets by name, never with their
	// values; SetCredential stores one and RemoveCredential deletes one.
	Credentials(ctx context.Context) ([]wire.Credential, error)
	SetCredential(ctx context.Context, name string, value []byte) (*wire.Credential, error)
	RemoveCredential(ctx context.Context, name string) error
	// Login stores a preset's model API key, or imports the server's
	// user's own sign-in of the agent.
	Login(ctx context.Context, req wire.LoginRequest) (*wire.LoginResult, error)

	// SSHUserCA returns the SSH user CA (created on first use);
	// RotateSSHUserCA replaces its key.
	SSHUserCA(ctx context.Context) (*wire.SSHCA, error)
	RotateSSHUserCA(ctx context.Context) (*wire.SSHCA, error)

	// Kernels lists the cached guest kernels; BuildKernel builds smx's
	// own (minutes); RemoveKernel removes one no sandbox or snapshot is
	// pinned to.
	Kernels(ctx context.Context) ([]wire.Kernel, error)
	BuildKernel(ctx context.Context, req wire.KernelBuildRequest) (*wire.Kernel, error)
	RemoveKernel(ctx context.Context, version string) error
	// Doctor checks the server's host.
	Doctor(ctx context.Context) (*wire.DoctorReport, error)

	// Templates lists the boot templates; RemoveTemplate removes one.
	Templates(ctx context.Context) ([]wire.Snapshot, error)
	RemoveTemplate(ctx context.Context, name string) error
	// PushTemplate and PushSnapshot send one to a registry as an artifact
	// signed by the server's log key; PullTemplate and PullSnapshot fetch
	// one, only if it verifies against the keys the server trusts (and
	// req.Keys) and this host can restore it.
	PushTemplate(ctx context.Context, name string, req wire.PushRequest) (*wire.PushResult, error)
	PullTemplate(ctx context.Context, req wire.PullRequest) (*wire.PullResult, error)
	PushSnapshot(ctx context.Context, name string, req wire.PushRequest) (*wire.PushResult, error)
	PullSnapshot(ctx context.Context, req wire.PullRequest) (*wire.PullResult, error)
	// LogNames lists every sandbox log; PruneLogs deletes those of
	// removed sandboxes.
	LogNames(ctx context.Context) ([]string, error)
	PruneLogs(ctx context.Context, req wire.LogPruneRequest) (*wire.LogPruneResult, error)

	// Logs calls fn for each record q selects; with q.Follow it then
	// waits for new ones until ctx ends.
	Logs(ctx context.Context, name string, q LogQuery, fn func(wire.Record) error) error
	VerifyLog(ctx context.Context, name string) (*wire.VerifyReport, error)
	// Events calls fn for each lifecycle change and refusal from now on,
	// until ctx ends.
	Events(ctx context.Context, q EventQuery, fn func(wire.Event) error) error
}

// ExecIO wires a process's streams. A nil Stdin means no stdin.
type ExecIO struct {
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
	Resize  <-chan WindowSize
	Signal  <-chan int
	Started func(pid int)
}

// WindowSize is a terminal size.
type WindowSize struct{ Rows, Cols uint16 }

// ExitStatus is how a process ended; Code is 128+Signal when killed.
type ExitStatus struct{ Code, Signal int }

// StartError is an exec whose command could not start: ExitCode is what a
// shell gives it (127 not found, 126 not executable).
type StartError struct {
	ExitCode int
	Message  string
}

func (e *StartError) Error() string { return e.Message }

// LogQuery selects log records.
type LogQuery struct {
	Follow   bool
	Refusals bool
	Since    time.Time
	// Ready, when set with Follow, is called once the records already in
	// the log have been passed to fn, before waiting for new ones.
	Ready func()
}

// EventQuery selects events: only these sandboxes (all when empty); All
// adds every log record, not only lifecycle changes and refusals.
type EventQuery struct {
	Sandboxes []string
	All       bool
}
