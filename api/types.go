// Package api holds the wire types of smx's local HTTP API (`smx serve`)
// and its OpenAPI 3 document. The server (internal/api) and the Go client
// (package client) share these types, so the JSON each side reads is the
// JSON the other writes.
//
// Every JSON field is snake_case; times are RFC 3339; absent optional
// fields are omitted. Errors are an Error object with an HTTP status that
// follows from its class (see StatusOf in internal/api).
package api

import (
	_ "embed"
	"time"
)

// OpenAPI is the API's OpenAPI 3 document (openapi.yaml), also served at
// GET /v1/openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte

// Version is the API version, the first element of every path.
const Version = "v1"

// Error classes: the errdefs class of the failure, carried in Error.Class.
const (
	ClassNotFound    = "not_found"
	ClassExists      = "exists"
	ClassInvalid     = "invalid"
	ClassInUse       = "in_use"
	ClassUnavailable = "unavailable"
	ClassDenied      = "denied"
	ClassFailed      = "failed_precondition"
	ClassTooLarge    = "too_large"
	ClassInternal    = "internal"
)

// Error is the body of every answer whose status is not 2xx.
type Error struct {
	Class   string `json:"class"`
	Message string `json:"message"`
	// ExitCode is set on a failed exec whose command could not start:
	// 127 not found, 126 not executable.
	ExitCode int `json:"exit_code,omitempty"`
}

// Info answers GET /v1/info.
type Info struct {
	API     string `json:"api"`
	Version string `json:"version"`
	State   string `json:"state_dir"`
}

// Image is a guest image.
type Image struct {
	Name      string    `json:"name"`
	Source    string    `json:"source"`
	Digest    string    `json:"digest"`
	Created   time.Time `json:"created"`
	Size      int64     `json:"size"`
	DiskBytes int64     `json:"disk_bytes"`
}

// ImageRequest is the body of POST /v1/images: build an image From
// busybox (seconds) or debian (minutes, needs root), or import Ref
// (docker-archive:FILE or oci-layout:DIR, a path on the server's host).
type ImageRequest struct {
	Name     string   `json:"name"`
	From     string   `json:"from,omitempty"`
	Packages []string `json:"packages,omitempty"` // extra Debian packages
	Ref      string   `json:"ref,omitempty"`
}

// Sandbox is one sandbox: what it was created with and where it is in its
// life. QEMUArgs is set only by inspect (GET /v1/sandboxes/{name}).
type Sandbox struct {
	Name          string    `json:"name"`
	Status        string    `json:"status"`
	Image         string    `json:"image"`
	Profile       string    `json:"profile"`
	ProfileHash   string    `json:"profile_hash"`
	CPUs          int       `json:"cpus"`
	MemoryMiB     int       `json:"memory_mib"`
	DiskBytes     int64     `json:"disk_bytes"`
	Env           []string  `json:"env,omitempty"`
	Mounts        []string  `json:"mounts,omitempty"`
	Snapshot      string    `json:"snapshot,omitempty"`
	Kernel        string    `json:"kernel,omitempty"`
	Created       time.Time `json:"created"`
	Started       time.Time `json:"started,omitzero"`
	Stopped       time.Time `json:"stopped,omitzero"`
	Accel         string    `json:"accel,omitempty"`
	BootMS        int64     `json:"boot_ms,omitempty"`
	RestoredFrom  string    `json:"restored_from,omitempty"`
	Timeout       string    `json:"timeout,omitempty"`     // --timeout, e.g. "10m"
	IdleStop      string    `json:"idle_stop,omitempty"`   // --idle-stop
	StopReason    string    `json:"stop_reason,omitempty"` // why the supervisor stopped it on its own: "--timeout 10m reached"
	Error         string    `json:"error,omitempty"`
	ConsoleTail   []string  `json:"console_tail,omitempty"`
	SupervisorPID int       `json:"supervisor_pid,omitempty"`
	QEMUPID       int       `json:"qemu_pid,omitempty"`
	QEMUArgs      []string  `json:"qemu_args,omitempty"`
	UptimeSeconds int64     `json:"uptime_seconds,omitempty"`
	// CPUSeconds and RSSBytes are what its QEMU process uses on the host
	// (CPU time since it started, resident memory), for a live sandbox.
	CPUSeconds float64 `json:"cpu_seconds,omitempty"`
	RSSBytes   int64   `json:"rss_bytes,omitempty"`
	Refusals   int64   `json:"refusals"`
	// Template is the boot template its first start restored instead of
	// booting.
	Template string `json:"template,omitempty"`
	// Preset, Workspace and AgentExitCode are set on a sandbox that
	// `smx agent run` (POST /v1/agents) started: the preset, the host
	// folder at /work and, once it has ended, the agent's exit status.
	Preset        string `json:"preset,omitempty"`
	Workspace     string `json:"workspace,omitempty"`
	AgentExitCode *int   `json:"agent_exit_code,omitempty"`
	// Usage is what the guest spent through model credentials, as the
	// credential broker read it from the models' answers.
	Usage []CredentialUsage `json:"usage,omitempty"`
	// Worktree is set on a sandbox made with --worktree: the Git worktree
	// mounted at /work and the one branch it may push.
	Worktree *Worktree `json:"worktree,omitempty"`
	// Caches are the package caches it uses (--volume-cache),
	// NAME:GUESTPATH:MODE.
	Caches []string `json:"caches,omitempty"`
}

// Worktree is a sandbox's own Git worktree of a host repository.
type Worktree struct {
	Repo   string `json:"repo"`   // the host repository's top folder
	Path   string `json:"path"`   // the worktree's folder, at /work in the guest
	Branch string `json:"branch"` // agent/NAME
}

// CredentialUsage is one model credential's running totals in a sandbox:
// requests and tokens over its life, and for the UTC day Day; Budget is
// the binding's cap, if it has one.
type CredentialUsage struct {
	Credential       string  `json:"credential"`
	Requests         int64   `json:"requests"`
	InputTokens      int64   `json:"input_tokens"`
	OutputTokens     int64   `json:"output_tokens"`
	CacheReadTokens  int64   `json:"cache_read_tokens,omitempty"`
	CacheWriteTokens int64   `json:"cache_write_tokens,omitempty"`
	Day              string  `json:"day,omitempty"`
	DayRequests      int64   `json:"day_requests,omitempty"`
	DayTokens        int64   `json:"day_tokens,omitempty"`
	Budget           *Budget `json:"budget,omitempty"`
}

// Budget is a credential binding's cap: tokens and/or requests, per
// "sandbox" or "day".
type Budget struct {
	Tokens   int64  `json:"tokens,omitempty"`
	Requests int64  `json:"requests,omitempty"`
	Per      string `json:"per"`
}

// CreateRequest is the body of POST /v1/sandboxes. Zero fields take the
// CLI's defaults (image busybox, profile dev, 1 CPU, 512M, disk 4G).
type CreateRequest struct {
	Name    string   `json:"name,omitempty"` // default: generated
	Image   string   `json:"image,omitempty"`
	Profile string   `json:"profile,omitempty"`
	CPUs    int      `json:"cpus,omitempty"`
	Memory  string   `json:"memory,omitempty"` // e.g. "512M"
	Disk    string   `json:"disk,omitempty"`   // e.g. "4G"
	Accel   string   `json:"accel,omitempty"`  // kvm or tcg; default detect
	Env     []string `json:"env,omitempty"`    // KEY=VALUE for every exec
	Mounts  []string `json:"mounts,omitempty"` // HOST:GUEST[:ro,uid=N,gid=N]
	// Caches are package caches that outlive the sandbox,
	// NAME[:GUESTPATH][:ro|shared] (--volume-cache).
	Caches []string `json:"caches,omitempty"`
	// Ports are guest ports published on the host,
	// [HOSTIP:]HOSTPORT:GUESTPORT[/tcp] (HOSTIP 127.0.0.1 unless given;
	// one that is not loopback needs PublishExternal).
	Ports           []string `json:"ports,omitempty"`
	PublishExternal bool     `json:"publish_external,omitempty"`
	// Timeout and IdleStop are the sandbox's limits (--timeout,
	// --idle-stop): Go durations of at least 1s; empty, none.
	Timeout  string `json:"timeout,omitempty"`
	IdleStop string `json:"idle_stop,omitempty"`
	Start    bool   `json:"start,omitempty"` // boot it before answering
	Cold     bool   `json:"cold,omitempty"`  // with start: never restore a boot template
}

// ExecRequest starts a process: the body of POST /v1/sandboxes/{name}/exec
// and the first (text) message of the exec WebSocket.
type ExecRequest struct {
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	User string   `json:"user,omitempty"`
	TTY  bool     `json:"tty,omitempty"`
	Rows uint16   `json:"rows,omitempty"` // initial terminal size with tty
	Cols uint16   `json:"cols,omitempty"`
	// Stdin: on the WebSocket, whether the client sends stdin (else the
	// process reads /dev/null). On POST, StdinData is the whole input.
	Stdin     bool   `json:"stdin,omitempty"`
	StdinData string `json:"stdin_data,omitempty"`
}

// ExecResult answers POST /v1/sandboxes/{name}/exec: the process ran to
// its end and its output was collected (up to MaxExecOutput bytes each;
// Truncated says when more was dropped).
type ExecResult struct {
	ExitCode  int    `json:"exit_code"`
	Signal    int    `json:"signal,omitempty"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated,omitempty"`
}

// MaxExecOutput bounds each stream collected by a buffered exec.
const MaxExecOutput = 16 << 20

// Exec WebSocket framing (GET /v1/sandboxes/{name}/exec, subprotocol
// ExecSubprotocol). Client → server: the first message is a text
// ExecRequest; then binary messages are stdin bytes, and text messages are
// ExecControl (stdin_eof, resize, signal). Server → client: binary messages
// whose first byte is StreamStdout or StreamStderr followed by the data,
// and text ExecControl messages: started (pid), then exactly one of exit
// (code, signal) or error (class, message, exit_code). The server then
// closes with status 1000. A client that goes away ends the process.
const (
	ExecSubprotocol = "smx.exec.v1"
	StreamStdout    = 1
	StreamStderr    = 2
)

// ExecControl is a text message on the exec WebSocket.
type ExecControl struct {
	Type     string `json:"type"` // started, exit, error; stdin_eof, resize, signal
	PID      int    `json:"pid,omitempty"`
	Code     int    `json:"code,omitempty"`
	Signal   int    `json:"signal,omitempty"`
	Rows     uint16 `json:"rows,omitempty"`
	Cols     uint16 `json:"cols,omitempty"`
	Class    string `json:"class,omitempty"`
	Message  string `json:"message,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
}

// CopyResult answers PUT /v1/sandboxes/{name}/files.
type CopyResult struct {
	Bytes int64 `json:"bytes"`
}

// SnapshotRequest is the body of POST /v1/sandboxes/{name}/snapshots.
type SnapshotRequest struct {
	Name string `json:"name,omitempty"` // default SANDBOX-DATE-TIME
	Stop bool   `json:"stop,omitempty"` // stop the sandbox afterwards
}

// Snapshot is a saved sandbox: memory, devices and disk.
type Snapshot struct {
	Name          string    `json:"name"`
	Source        string    `json:"source"`
	Parent        string    `json:"parent,omitempty"`
	Created       time.Time `json:"created"`
	Image         string    `json:"image"`
	ImageDigest   string    `json:"image_digest,omitempty"`
	Profile       string    `json:"profile"`
	ProfileHash   string    `json:"profile_hash"`
	CPUs          int       `json:"cpus"`
	MemoryMiB     int       `json:"memory_mib"`
	DiskBytes     int64     `json:"disk_bytes"`
	Kernel        string    `json:"kernel,omitempty"`
	QEMUVersion   string    `json:"qemu_version,omitempty"`
	InitramfsHash string    `json:"initramfs_hash,omitempty"`
	Accel         string    `json:"accel,omitempty"`
	// Machine, CPU and CPUFlags are the machine type and virtual CPU the
	// state ran on (CPUFlags the host's, under KVM), which a restore
	// and a pull on another host check.
	Machine  string   `json:"machine,omitempty"`
	CPU      string   `json:"cpu,omitempty"`
	CPUFlags []string `json:"cpu_flags,omitempty"`
	Template string   `json:"template,omitempty"` // the source's boot template
	Env      []string `json:"env,omitempty"`
	Mounts   []string `json:"mounts,omitempty"` // the source's -v mounts
	Ports    []string `json:"ports,omitempty"`  // the source's -p ports
	// Timeout and IdleStop are the source's limits, which a fork keeps
	// unless its request replaces them.
	Timeout  string `json:"timeout,omitempty"`
	IdleStop string `json:"idle_stop,omitempty"`
	// SharedRAMBytes, for a boot template (GET /v1/templates), is the
	// space its shared-RAM form takes on the host (0 while it has none).
	SharedRAMBytes   int64  `json:"shared_ram_bytes,omitempty"`
	MemoryStateBytes int64  `json:"memory_state_bytes"`
	DiskFileBytes    int64  `json:"disk_file_bytes"`
	MemoryDigest     string `json:"memory_digest"`
	DiskDigest       string `json:"disk_digest"`
	SaveMS           int64  `json:"save_ms"`
	Verified         bool   `json:"verified,omitempty"` // digests checked (?verify=true)
}

// PushRequest is the body of POST /v1/snapshots/{name}/push and POST
// /v1/templates/{name}/push: send it to a registry as an artifact signed
// by the server's log key.
type PushRequest struct {
	Ref        string `json:"ref"`
	Compress   string `json:"compress,omitempty"`    // zstd (default) or none, for the memory layer
	WithKernel bool   `json:"with_kernel,omitempty"` // send the guest kernel along
}

// PushedLayer is one blob of a pushed artifact.
type PushedLayer struct {
	Role      string `json:"role"`
	MediaType string `json:"media_type"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	DiffID    string `json:"diff_id"`
	DiffSize  int64  `json:"diff_size"`
	Sent      bool   `json:"sent"` // false when the registry already had it
}

// PushResult is what a push did.
type PushResult struct {
	Kind         string        `json:"kind"`     // snapshot or template
	Snapshot     string        `json:"snapshot"` // the snapshot's or template's name
	Ref          string        `json:"ref"`
	Digest       string        `json:"digest"`
	Signer       string        `json:"signer"`
	Layers       []PushedLayer `json:"layers"`
	BytesTotal   int64         `json:"bytes_total"`
	BytesSent    int64         `json:"bytes_sent"`
	MemoryBytes  int64         `json:"memory_bytes"`
	MemoryStored int64         `json:"memory_stored"`
	CompressMS   int64         `json:"compress_ms"`
	DurationMS   int64         `json:"duration_ms"`
}

// PullRequest is the body of POST /v1/snapshots/pull and POST
// /v1/templates/pull: fetch an artifact, only if signed by a key the
// server trusts (its trusted-log-keys file, or one of Keys).
type PullRequest struct {
	Ref  string   `json:"ref"`
	Name string   `json:"name,omitempty"` // a snapshot's local name; a template keeps its own
	Keys []string `json:"keys,omitempty"` // verifier keys to trust besides the server's
}

// PullResult is what a pull did.
type PullResult struct {
	Kind        string `json:"kind"`
	Snapshot    string `json:"snapshot"` // the local snapshot's or template's name
	Ref         string `json:"ref"`
	Digest      string `json:"digest"`
	Signer      string `json:"signer"`
	Bytes       int64  `json:"bytes"`
	DurationMS  int64  `json:"duration_ms"`
	Present     bool   `json:"present,omitempty"`      // the template was there already
	Image       string `json:"image,omitempty"`        // the image a template serves
	ImageDigest string `json:"image_digest,omitempty"` // ... by digest
	ImageOnHost bool   `json:"image_on_host,omitempty"`
}

// ForkRequest is the body of POST /v1/snapshots/{name}/fork.
type ForkRequest struct {
	Name    string `json:"name"`
	Profile string `json:"profile,omitempty"` // default: the snapshot's
	// Ports are published on the fork; the snapshot's own are published
	// again only with KeepPorts.
	Ports           []string `json:"ports,omitempty"`
	KeepPorts       bool     `json:"keep_ports,omitempty"`
	PublishExternal bool     `json:"publish_external,omitempty"`
	// Timeout and IdleStop replace the limits a fork keeps from its
	// snapshot's source: "" keeps one, "0" removes it, "10m" sets it.
	Timeout  string `json:"timeout,omitempty"`
	IdleStop string `json:"idle_stop,omitempty"`
}

// PortRequest is the body of POST /v1/sandboxes/{name}/ports.
type PortRequest struct {
	Port            string `json:"port"` // [HOSTIP:]HOSTPORT:GUESTPORT[/tcp]
	PublishExternal bool   `json:"publish_external,omitempty"`
}

// PortBinding is one published port.
type PortBinding struct {
	HostIP    string `json:"host_ip"`
	HostPort  int    `json:"host_port"` // as published; 0 asks for a free one at each start
	GuestPort int    `json:"guest_port"`
	Bound     int    `json:"bound"` // the host port served now; 0 while the sandbox does not run
	External  bool   `json:"external,omitempty"`
}

// PortList is a sandbox's published ports: GET, POST and DELETE
// /v1/sandboxes/{name}/ports.
type PortList struct {
	Sandbox string        `json:"sandbox"`
	Running bool          `json:"running"`
	Ports   []PortBinding `json:"ports"`
}

// MountRequest is the body of POST /v1/sandboxes/{name}/mounts.
type MountRequest struct {
	Mount string `json:"mount"` // HOST:GUEST[:ro,uid=N,gid=N,protect=off], as -v
}

// MountList is a running sandbox's mounts in -v notation: POST and DELETE
// /v1/sandboxes/{name}/mounts.
type MountList struct {
	Sandbox string   `json:"sandbox"`
	Mounts  []string `json:"mounts"`
}

// Profile is a security profile as resolved.
type Profile struct {
	Name        string `json:"name"`
	Source      string `json:"source"`
	Hash        string `json:"hash,omitempty"`
	NetworkMode string `json:"network_mode,omitempty"`
	YAML        string `json:"yaml,omitempty"` // show only
	Error       string `json:"error,omitempty"`
}

// CheckRequest is the body of POST /v1/profiles/check.
type CheckRequest struct {
	YAML string `json:"yaml"`
	File string `json:"file,omitempty"` // name used in problems; default "profile.yaml"
}

// CheckResult lists every problem of a profile as file:line:col, and,
// when it has none, every warning as file:line:col: warning: (a file the
// host runs opened to the guest, a forge the network rules do not let the
// guest reach). Warnings do not make OK false.
type CheckResult struct {
	OK       bool     `json:"ok"`
	Hash     string   `json:"hash,omitempty"`
	Problems []string `json:"problems,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

// ExplainRequest is the body of POST /v1/profiles/{name}/explain: a request
// as `smx profile explain` takes it (https://host/, tcp:IP:PORT,
// file:rw:/path, git:push:REPO:REF, ssh:USER@HOST:PORT).
type ExplainRequest struct {
	Request string `json:"request"`
}

// Explanation is a profile's decision on a request, with the rule.
type Explanation struct {
	Profile string `json:"profile"`
	Request string `json:"request"`
	Allow   bool   `json:"allow"`
	// Ask: the rule says ask (the request would be held for the host
	// user's answer; see Approval).
	Ask    bool   `json:"ask,omitempty"`
	Rule   string `json:"rule"`
	Reason string `json:"reason"`
	// Details are what follows from the decision, one line each: the
	// credential the gateway sends with the request, how an SSH login is
	// made and what it may do, a forge the network rules do not reach.
	Details []string `json:"details,omitempty"`
}

// PolicyRequest is the body of PUT /v1/sandboxes/{name}/policy.
type PolicyRequest struct {
	Profile string `json:"profile"`
}

// PolicyResult says what a policy change did.
type PolicyResult struct {
	Sandbox     string `json:"sandbox"`
	Profile     string `json:"profile"`
	Hash        string `json:"hash"`
	Applied     bool   `json:"applied"` // a live supervisor enforces it now
	ClosedFlows int    `json:"closed_flows"`
}

// Record is one entry of a sandbox's log, as stored (hashes base64).
type Record struct {
	Seq     int64          `json:"seq"`
	Time    time.Time      `json:"time"`
	Sandbox string         `json:"sandbox"`
	Kind    string         `json:"kind"`
	Fields  map[string]any `json:"fields"`
	Prev    string         `json:"prev"`
	Hash    string         `json:"hash"`
}

// VerifyReport is what verifying a log found; OK is false when any
// problem was found, the first bad thing first.
type VerifyReport struct {
	Sandbox     string   `json:"sandbox"`
	LogID       string   `json:"log_id"`
	OK          bool     `json:"ok"`
	Records     int64    `json:"records"`
	Checkpoints int      `json:"checkpoints"`
	Closed      bool     `json:"closed"`
	Uncovered   int64    `json:"uncovered"`
	FirstBad    int64    `json:"first_bad"`
	Problems    []string `json:"problems,omitempty"`
	Notes       []string `json:"notes,omitempty"`
	Summary     string   `json:"summary"`
	// Key says how the signing key was checked: "pinned" (against the
	// key pinned for this state directory), "unpinned" (the state
	// directory's own key; nothing pinned yet), "replaced" (the state
	// directory's key is not the pinned one: checked against the pin,
	// and a problem), or "given" (a key the caller supplied).
	Key string `json:"key,omitempty"`
}

// Event is one line of GET /v1/events: a sandbox changed status (type
// "status", Status set; "removed" when it is gone), or its log recorded a
// lifecycle event or a refusal (type "record", Record set), or a question
// was put to the host user or answered (type "approval", Approval set).
type Event struct {
	Time    time.Time `json:"time"`
	Sandbox string    `json:"sandbox"`
	Type    string    `json:"type"`
	Status  string    `json:"status,omitempty"`
	Refusal bool      `json:"refusal,omitempty"`
	Record  *Record   `json:"record,omitempty"`
	// Approval is set on type "approval": a question was put or answered
	// (its State says which).
	Approval *Approval `json:"approval,omitempty"`
}

// AgentRequest is the body of POST /v1/agents: launch a preset's coding
// agent (claude, codex, gemini, shell, or a user's preset on the server's
// host) on Workspace, a folder on the server's host mounted at /work.
// Zero fields take `smx agent run`'s defaults (the preset's profile, 1
// CPU, 2G, disk 16G).
type AgentRequest struct {
	Preset    string   `json:"preset"`
	Workspace string   `json:"workspace"`      // absolute path on the server's host
	Args      []string `json:"args,omitempty"` // appended to the preset's command
	Name      string   `json:"name,omitempty"` // default: generated
	Profile   string   `json:"profile,omitempty"`
	CPUs      int      `json:"cpus,omitempty"`
	Memory    string   `json:"memory,omitempty"`
	Disk      string   `json:"disk,omitempty"`
	Accel     string   `json:"accel,omitempty"`
	Mounts    []string `json:"mounts,omitempty"`
	Caches    []string `json:"caches,omitempty"` // as CreateRequest's, owned by the preset's user
	// Ports and PublishExternal are CreateRequest's.
	Ports           []string `json:"ports,omitempty"`
	PublishExternal bool     `json:"publish_external,omitempty"`
	// Timeout and IdleStop are CreateRequest's.
	Timeout  string `json:"timeout,omitempty"`
	IdleStop string `json:"idle_stop,omitempty"`
	Cold     bool   `json:"cold,omitempty"`
	Term     string `json:"term,omitempty"`   // the agent's TERM; default xterm-256color
	Remove   bool   `json:"remove,omitempty"` // delete the sandbox once the agent exits
	// ImportConfig copies the server user's own configuration of the
	// agent (settings, instructions, sub-agents, commands, skills, hooks,
	// MCP servers; never sign-ins, keys or history) into the guest.
	ImportConfig bool `json:"import_config,omitempty"`
	// Docker adds Docker Engine to the preset: its packages in the
	// image, dockerd started in the guest, the registries' names in the
	// profile (agent run --docker).
	Docker bool `json:"docker,omitempty"`
}

// Agent is a sandbox that runs a preset's agent: GET /v1/agents/{name},
// and the last line of POST /v1/agents. ExitCode is set once the agent has
// exited (the sandbox is then stopped, or removed with Remove).
type Agent struct {
	Sandbox   Sandbox    `json:"sandbox"`
	Preset    string     `json:"preset"`
	Workspace string     `json:"workspace,omitempty"`
	User      string     `json:"user,omitempty"`
	Workdir   string     `json:"workdir,omitempty"`
	Command   []string   `json:"command"`
	Remove    bool       `json:"remove,omitempty"`
	ExitCode  *int       `json:"exit_code,omitempty"`
	Exited    *time.Time `json:"exited,omitempty"`
}

// AgentEvent is one line of the answer to POST /v1/agents (JSON lines):
// "progress" lines (Stage image: a build starts, minutes; build: one line
// of its output; warning; create; start; agent), then exactly one "agent"
// (Agent set) or "error" (Error set) line.
type AgentEvent struct {
	Type    string `json:"type"`
	Stage   string `json:"stage,omitempty"`
	Message string `json:"message,omitempty"`
	Agent   *Agent `json:"agent,omitempty"`
	Error   *Error `json:"error,omitempty"`
}

// Approval channels: which gateway holds the request.
const (
	ChannelNetwork    = "network"
	ChannelFile       = "file"
	ChannelGit        = "git"
	ChannelSSH        = "ssh"
	ChannelCredential = "credential"
)

// Approval states. A pending approval holds a request in a gateway; every
// other state is final.
const (
	ApprovalPending = "pending"
	ApprovalGranted = "granted"
	ApprovalDenied  = "denied"
	ApprovalTimeout = "timeout" // no answer within ask.timeout: refused as if denied
)

// Decisions a host user can give (POST /v1/approvals/{id}).
const (
	DecideDeny    = "deny"
	DecideOnce    = "once"    // this request only; the next identical one asks again
	DecideSandbox = "sandbox" // what was asked, for the rest of this sandbox's life
	DecideAlways  = "always"  // writes a rule into the profile file and reloads it
)

// Approval is a question a gateway put to the host user because a rule
// says ask: one held request (GET /v1/approvals, POST /v1/approvals/{id},
// and "approval" lines of GET /v1/events).
type Approval struct {
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	Channel string `json:"channel"` // network, file, git, ssh, credential
	// What is the exact thing asked, e.g. "tcp packages.example.test:443
	// (TLS server name)" or "push refs/heads/main (fast-forward, 3 commits)".
	What string `json:"what"`
	// Rule is the rule that said ask (as decisions name rules); Source its
	// place in the profile file, "FILE:LINE:COL".
	Rule    string    `json:"rule"`
	Source  string    `json:"source,omitempty"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
	State   string    `json:"state"` // pending, granted, denied, timeout
	// Decision, once answered: deny, once, sandbox or always; By says who
	// answered through which interface (e.g. "cli uid 1000", "api", "mcp").
	Decision string `json:"decision,omitempty"`
	By       string `json:"by,omitempty"`
	// For always: the rule text written into ProfileFile.
	RuleWritten string `json:"rule_written,omitempty"`
	ProfileFile string `json:"profile_file,omitempty"`
}

// Approvals is the answer to GET /v1/approvals (optionally ?sandbox=NAME).
type Approvals struct {
	Approvals []Approval `json:"approvals"`
}

// ApprovalDecision is the body of POST /v1/approvals/{id}.
type ApprovalDecision struct {
	Decision string `json:"decision"` // deny, once, sandbox, always
}

// Credential is a secret in the host-side store: GET /v1/creds. No route
// ever answers with a secret's value.
type Credential struct {
	Name         string    `json:"name"`
	Bytes        int       `json:"bytes"`
	SHA256Prefix string    `json:"sha256_prefix"` // first 8 hex digits of the value's SHA-256: tells versions apart
	Updated      time.Time `json:"updated"`
	Presets      []string  `json:"presets,omitempty"` // the agent presets that send it
	SignIn       bool      `json:"sign_in,omitempty"` // part of an imported sign-in the host refreshes
}

// CredentialRequest is the body of PUT /v1/creds/{name}: the secret's
// value (a trailing newline is dropped).
type CredentialRequest struct {
	Value string `json:"value"`
}

// LoginRequest is the body of POST /v1/creds/login: store preset's model
// API key (Key), or import the server's user's own sign-in of the agent
// (Import; File defaults to the preset's under that user's $HOME).
type LoginRequest struct {
	Preset string `json:"preset"`
	Key    string `json:"key,omitempty"`
	Import bool   `json:"import,omitempty"`
	File   string `json:"file,omitempty"`
}

// LoginResult says what POST /v1/creds/login stored (never the value).
type LoginResult struct {
	Preset  string    `json:"preset"`
	Secret  string    `json:"secret"`           // the name it is stored under
	Bytes   int       `json:"bytes,omitempty"`  // an API key's length
	Header  string    `json:"header,omitempty"` // the header an API key is sent in
	File    string    `json:"file,omitempty"`   // the sign-in file imported
	What    string    `json:"what,omitempty"`   // the subscription or account, when the file says
	Expires time.Time `json:"expires,omitzero"` // when the imported access token expires
}

// SSHCA is the smx SSH user CA (GET /v1/ssh-ca; POST /v1/ssh-ca/rotate):
// its public key and the lines a target host installs to trust it. Its
// private key never leaves the server's state directory.
type SSHCA struct {
	PublicKey         string `json:"public_key"` // an authorized_keys line
	Fingerprint       string `json:"fingerprint"`
	TrustedUserCAKeys string `json:"trusted_user_ca_keys"` // the sshd_config line
	AuthorizedKeys    string `json:"authorized_keys"`      // the line for one account (USER)
	Replaced          string `json:"replaced,omitempty"`   // after a rotation: the old key's fingerprint
}

// Kernel is a cached guest kernel and who is pinned to it: GET
// /v1/kernels (newest, the default for new sandboxes, first).
type Kernel struct {
	Version   string   `json:"version"`
	Default   bool     `json:"default"` // what new sandboxes get
	Own       bool     `json:"own"`     // smx's own kernel (built from Debian's source)
	Sandboxes []string `json:"sandboxes"`
	Snapshots []string `json:"snapshots"`
}

// KernelBuildRequest is the body of POST /v1/kernels: build smx's own
// guest kernel from Debian's kernel source on the server's host
// (minutes; cached by source version and config).
type KernelBuildRequest struct {
	Jobs    int    `json:"jobs,omitempty"`     // make -j; 0: one per CPU
	Nice    bool   `json:"nice,omitempty"`     // compile at low priority
	WorkDir string `json:"work_dir,omitempty"` // keep the build tree there
}

// Requirement is one thing smx needs on the host.
type Requirement struct {
	Name     string `json:"name"`
	Found    bool   `json:"found"`
	Detail   string `json:"detail,omitempty"`
	Fix      string `json:"fix,omitempty"`
	Optional bool   `json:"optional,omitempty"`
}

// DoctorReport is GET /v1/doctor: the server host's tools, guest
// kernel, accelerator, state directory and free space. OK is false when
// a requirement that is not optional is missing.
type DoctorReport struct {
	Requirements []Requirement `json:"requirements"`
	Accel        string        `json:"accel"`
	AccelReason  string        `json:"accel_reason"`
	StateDir     string        `json:"state_dir"`
	DiskFree     int64         `json:"disk_free_bytes"`
	OK           bool          `json:"ok"`
}

// LogPruneRequest is the body of POST /v1/logs/prune: delete the logs of
// removed sandboxes, by name or All (then Names is empty).
type LogPruneRequest struct {
	Names []string `json:"names,omitempty"`
	All   bool     `json:"all,omitempty"`
}

// LogPruneResult lists the logs pruned.
type LogPruneResult struct {
	Pruned []string `json:"pruned"`
}
