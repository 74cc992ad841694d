// Package supproto is the protocol between the host service (the CLI,
// `smx serve`) and a sandbox's supervisor, over the supervisor's unix
// socket (sup.sock in the sandbox directory). It is not the guest's
// protocol (internal/agentproto): the supervisor answers some requests
// itself and turns the others into guest requests through an explicit
// list (ToGuest), so nothing a client sends reaches the guest agent
// unless this package says it may.
//
// One connection carries one request. Its first frame is a FrameRequest
// holding a JSON Request; the frames that follow, and the framing itself
// (1 byte type, 4 bytes big-endian length, payload), are agentproto's:
//
//   - OpExec: as agentproto.OpExec (stdin, resize and signal frames in;
//     started, stdout, stderr out, then one exit or error frame). The
//     supervisor logs the exec's start and end.
//   - OpCopyIn, OpCopyOut: as agentproto's, relayed.
//   - OpHealth: relayed; one result frame.
//   - OpCopyRefused: the client refused the stream of a copy out (Path,
//     Reason); the supervisor logs it and answers one FrameResult.
//   - OpPortAdd, OpPortRemove, OpPortList: answered by the supervisor
//     with one FrameResult whose Ports are the bindings now served.
//   - OpMountAdd, OpMountRemove: answered by the supervisor with one
//     FrameResult whose Mounts are the mounts served afterwards.
//   - OpApprovals, OpApprove: answered by the supervisor with one
//     FrameResult (the pending approvals, or the one answered).
//   - OpSSH: after the request the connection carries one SSH connection
//     (client to the supervisor's SSH server, internal/sshserve), raw
//     both ways; refused requests get one FrameError instead.
//   - OpStop, OpPause, OpResume, OpSuspend, OpSnapshot, OpSetProfile, OpDiscard:
//     answered by the supervisor with one FrameResult (a JSON Result) or
//     one FrameError.
//
// A FrameError holds an agentproto.Error whose Class is the error's
// errdefs class, so errors.Is works on the client's side.
package supproto

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/publish"
)

// Ops.
const (
	// Relayed to the guest agent (see ToGuest).
	OpExec    = "exec"
	OpCopyIn  = "copy-in"
	OpCopyOut = "copy-out"
	OpHealth  = "health"

	// Answered by the supervisor.
	OpStop       = "stop"        // power off within TimeoutMS, then quit or kill QEMU; the supervisor exits
	OpPause      = "pause"       // stop the vCPUs; RAM stays in place
	OpResume     = "resume"      // continue a paused (or blocked) guest
	OpSuspend    = "suspend"     // save the guest's state to the sandbox directory, then exit
	OpSnapshot   = "snapshot"    // save memory, devices and disk as snapshot Snapshot
	OpSetProfile = "set-profile" // apply the sandbox's profile.yaml to new and live flows
	// OpDiscard ends a throwaway sandbox (`smx run`): QEMU is killed (the
	// disk goes next, so the guest is not shut down) and the status
	// becomes removing before the answer; the supervisor then logs the
	// stop and the removal, closes the log and deletes the sandbox on
	// its own, and exits.
	OpDiscard = "discard"
	// OpCopyRefused logs a copy out whose stream the host refused.
	OpCopyRefused = "copy-refused"
	// OpPortAdd publishes Port (bound before the answer, and written to
	// the spec so later starts bind it too); OpPortRemove withdraws the
	// published port Port names by host address and port (open
	// connections through it are closed); OpPortList lists them.
	OpPortAdd    = "port-add"
	OpPortRemove = "port-rm"
	OpPortList   = "port-ls"
	// OpMountAdd mounts Volume (-v notation, host path absolute) in the
	// running guest over the sandbox's virtio-fs device (bound before the
	// answer, written to the spec so later starts mount it too);
	// OpMountRemove unmounts the mount at guest path Path and drops its
	// tree on the host, so nothing the guest still holds there reaches
	// the host folder again.
	OpMountAdd    = "mount-add"
	OpMountRemove = "mount-rm"
	// OpApprovals lists the questions the sandbox's gateways hold
	// (Result.Approvals); OpApprove answers one (ID, Decision, By,
	// Extra) and returns it (Result.Approval). See internal/approval.
	OpApprovals = "approvals"
	OpApprove   = "approve"
	// OpSSH serves one SSH connection on the rest of the connection
	// (`smx agent ssh-proxy`).
	OpSSH = "ssh"
)

// Ops lists every op, for whoever must decide on each (the supervisor
// checks each against the state table).
var Ops = []string{
	OpExec, OpCopyIn, OpCopyOut, OpHealth,
	OpStop, OpPause, OpResume, OpSuspend, OpSnapshot, OpSetProfile, OpDiscard, OpCopyRefused,
	OpPortAdd, OpPortRemove, OpPortList, OpMountAdd, OpMountRemove, OpSSH, OpApprovals, OpApprove,
}

// Request is the first frame of every connection.
type Request struct {
	Op string `json:"op"`

	// OpExec.
	Exec *ExecRequest `json:"exec,omitempty"`
	// Audit names how an exec is logged: "run" for the command of
	// `smx run`, otherwise an exec.
	Audit string `json:"audit,omitempty"`

	// OpCopyIn: directory to extract into. OpCopyOut: path to archive.
	// OpCopyRefused: the path whose copy was refused. OpMountRemove: the
	// guest path of the mount.
	Path string `json:"path,omitempty"`
	// OpCopyRefused: why.
	Reason string `json:"reason,omitempty"`

	// OpStop: how long the guest gets to power off before QEMU is told
	// to quit, then killed.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`

	// OpSnapshot: the snapshot's name, and whether the sandbox stops
	// afterwards.
	Snapshot  string `json:"snapshot,omitempty"`
	StopAfter bool   `json:"stop_after,omitempty"`

	// OpPortAdd, OpPortRemove.
	Port *publish.Port `json:"port,omitempty"`

	// OpMountAdd: the mount, HOST:GUEST[:OPTIONS] as -v spells it.
	Volume string `json:"volume,omitempty"`

	// OpApprove: the approval, the answer, who gave it through which
	// interface, and fields for the record (for always: the rule written).
	ID       string         `json:"id,omitempty"`
	Decision string         `json:"decision,omitempty"`
	By       string         `json:"by,omitempty"`
	Extra    map[string]any `json:"extra,omitempty"`
}

// ExecRequest is a command to run in the guest. It is the guest's own
// type (an exec is relayed), but ToGuest still copies it field by field,
// so a field added to the guest's request reaches the guest from a
// client only once ToGuest says so.
type ExecRequest = agentproto.ExecRequest

// Result answers a request the supervisor carries out, or OpHealth.
type Result struct {
	OK bool `json:"ok"`
	// OpSnapshot, OpSuspend: bytes of saved memory state.
	Bytes int64 `json:"bytes,omitempty"`
	// OpPause, OpResume, OpSnapshot, OpSuspend: how long it took, and
	// for a save how long the guest was paused.
	DurationMS int64 `json:"duration_ms,omitempty"`
	// OpSetProfile: live flows the new profile closed.
	ClosedFlows int `json:"closed_flows,omitempty"`
	// OpHealth: the guest's kernel (/proc/version), uptime and hostname.
	Kernel   string  `json:"kernel,omitempty"`
	Uptime   float64 `json:"uptime,omitempty"`
	Hostname string  `json:"hostname,omitempty"`
	// OpPortAdd, OpPortRemove, OpPortList: the published ports served now.
	Ports []publish.Binding `json:"ports,omitempty"`
	// OpMountAdd, OpMountRemove: the sandbox's mounts afterwards, in -v
	// notation.
	Mounts []string `json:"mounts,omitempty"`
	// OpApprovals: the pending questions. OpApprove: the one answered.
	Approvals []approval.Approval `json:"approvals,omitempty"`
	Approval  *approval.Approval  `json:"approval,omitempty"`
}

// Relayed reports whether op is answered by the guest agent (through
// ToGuest) rather than by the supervisor.
func Relayed(op string) bool {
	_, ok := toGuest[op]
	return ok
}

// toGuest is the allow-list: the only requests a client can make of the
// guest agent, each rebuilt field by field.
var toGuest = map[string]func(*Request) (*agentproto.Request, error){
	OpExec: func(r *Request) (*agentproto.Request, error) {
		if r.Exec == nil || len(r.Exec.Args) == 0 {
			return nil, fmt.Errorf("supproto: exec without a command: %w", errdefs.ErrInvalid)
		}
		e := r.Exec
		return &agentproto.Request{Op: agentproto.OpExec, Exec: &agentproto.ExecRequest{
			Args: e.Args, Env: e.Env, Dir: e.Dir, User: e.User, TTY: e.TTY, Size: e.Size, Stdin: e.Stdin,
			Root: e.Root, Rlimits: e.Rlimits,
		}}, nil
	},
	OpCopyIn: func(r *Request) (*agentproto.Request, error) {
		return &agentproto.Request{Op: agentproto.OpCopyIn, Path: r.Path}, nil
	},
	OpCopyOut: func(r *Request) (*agentproto.Request, error) {
		return &agentproto.Request{Op: agentproto.OpCopyOut, Path: r.Path}, nil
	},
	OpHealth: func(r *Request) (*agentproto.Request, error) {
		return &agentproto.Request{Op: agentproto.OpHealth}, nil
	},
}

// ToGuest is the guest request a relayed client request becomes. Any op
// not on the list (a supervisor op, or a guest op a client may not ask
// for: set-time, install-ca, mount, poweroff, ...) is refused with
// errdefs.ErrInvalid.
func ToGuest(r *Request) (*agentproto.Request, error) {
	f, ok := toGuest[r.Op]
	if !ok {
		return nil, fmt.Errorf("supproto: op %q is not one a client can send to the guest: %w", r.Op, errdefs.ErrInvalid)
	}
	return f(r)
}

// WriteRequest sends the first frame of a connection.
func WriteRequest(w io.Writer, r *Request) error {
	return agentproto.WriteJSON(w, agentproto.FrameRequest, r)
}

// ReadRequest reads the first frame of a connection.
func ReadRequest(rd io.Reader) (*Request, error) {
	t, p, err := agentproto.ReadFrame(rd, nil)
	if err != nil {
		return nil, err
	}
	if t != agentproto.FrameRequest {
		return nil, fmt.Errorf("supproto: expected a request frame, got %s: %w", t, errdefs.ErrInvalid)
	}
	var r Request
	if err := json.Unmarshal(p, &r); err != nil {
		return nil, fmt.Errorf("supproto: decode request: %v: %w", err, errdefs.ErrInvalid)
	}
	return &r, nil
}

// WriteResult answers a request.
func WriteResult(w io.Writer, r Result) error {
	return agentproto.WriteJSON(w, agentproto.FrameResult, r)
}

// WriteError answers a request with err, its class kept.
func WriteError(w io.Writer, err error) error {
	return agentproto.WriteJSON(w, agentproto.FrameError, agentproto.ErrorOf(err))
}

// ReadResult reads the answer to a request: a Result, or the peer's
// error (an *agentproto.Error, its class kept).
func ReadResult(rd io.Reader) (*Result, error) {
	t, p, err := agentproto.ReadFrame(rd, nil)
	if err != nil {
		return nil, err
	}
	switch t {
	case agentproto.FrameResult:
		var res Result
		if err := json.Unmarshal(p, &res); err != nil {
			return nil, fmt.Errorf("supproto: decode result: %w", err)
		}
		return &res, nil
	case agentproto.FrameError:
		return nil, agentproto.DecodeError(p)
	}
	return nil, fmt.Errorf("supproto: expected a result, got a %s frame", t)
}
