// Package agentproto defines the messages between a sandbox's supervisor
// and smx-agent, the guest's PID 1. It is imported by both sides. Clients
// of the supervisor (the CLI, `smx serve`) speak internal/supproto, which
// uses this package's framing; the supervisor rebuilds the few requests
// they may relay (exec, copy-in, copy-out, health) as requests of this
// protocol, and sends the rest (time, entropy, hostname, CAs, mounts,
// poweroff) only on its own account.
//
// Transport: one virtio-serial port (named PortName) carries a yamux session
// in which the host is the client and the guest the server. Every request is
// one yamux stream.
//
// A stream starts with a Request frame sent by the host. What follows depends
// on Request.Op:
//
//   - OpExec: host sends FrameStdin / FrameStdinEOF / FrameResize /
//     FrameSignal; guest sends FrameStarted, then FrameStdout / FrameStderr,
//     and ends with exactly one FrameExit (or FrameError if the process could
//     not be started). Output frames are all sent before FrameExit.
//   - OpCopyIn: host sends FrameData frames holding a tar stream, then
//     FrameEOF; guest extracts it under Request.Path and answers FrameResult
//     (or FrameError).
//   - OpCopyOut: guest sends FrameData frames holding a tar stream of
//     Request.Path (the archive's top entry is the base name of Path), then
//     FrameEOF, or FrameError.
//   - OpMountData: raw 9P2000.L both ways after the request; OpMount then
//     mounts it and answers one FrameResult (or FrameError).
//   - OpDial: guest answers one FrameResult once connected to loopback
//     port Request.Port (or FrameError), then raw bytes both ways.
//   - OpHealth, OpSetTime, OpAddEntropy, OpSetHostname, OpPowerOff: guest answers one
//     FrameResult (JSON Result) or FrameError.
//
// All frames are: 1 byte type, 4 bytes big-endian payload length, payload.
// JSON payloads are used for control frames; data frames carry raw bytes.
package agentproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/smx-dev/smx/internal/errdefs"
)

// PortName is the virtio-serial port name the guest looks for in
// /sys/class/virtio-ports/*/name.
const PortName = "smx.ctl"

// SessionHello is what the guest writes on the port before each new yamux
// session: the host discards everything before it. After a restore the
// port may still carry the tail of the saved guest's old session (output
// of streams that were open at save time, even a frame cut in two), and
// the guest still holds that old session; the host ends it by sending
// SessionPoison bytes (no yamux header starts with 0xFF), the guest
// starts a new session with a hello, and skips leading poison bytes.
const SessionHello = "\x00\x00smx-session-v1\x00\x00"

// SessionPoison is the byte the host sends to end a stale guest session.
const SessionPoison = 0xFF

// MaxFrame bounds a single frame's payload so that a corrupt or hostile
// peer cannot make the other side allocate without limit.
const MaxFrame = 1 << 20

// DataChunk is the size writers use for stdout/stdin/tar data frames.
const DataChunk = 64 << 10

// Ops.
const (
	OpExec       = "exec"
	OpCopyIn     = "copy-in"
	OpCopyOut    = "copy-out"
	OpHealth     = "health"
	OpSetTime    = "set-time"
	OpAddEntropy = "add-entropy"
	OpPowerOff   = "poweroff"

	// OpSetHostname (guest) sets the hostname to Request.Hostname: a
	// sandbox restored from a snapshot gets its own name.
	OpSetHostname = "set-hostname"

	// OpInstallCA (guest) puts Request.CACert, the sandbox CA's
	// certificate (PEM, public), into the guest's trust store, replacing
	// the one a previous install (or the snapshot a fork came from) put
	// there. The gateway signs the certificates of brokered destinations
	// with it.
	OpInstallCA = "install-ca"

	// OpInstallSSHCA (guest) writes Request.SSHKnownHosts, the
	// "@cert-authority * KEY" line of the sandbox's SSH host CA, into the
	// guest's /etc/ssh/ssh_known_hosts, replacing the line a previous
	// install (or the snapshot a fork came from) put there. The SSH
	// gateway's host certificates are signed by that CA.
	OpInstallSSHCA = "install-ssh-ca"
	// OpMountData (guest) opens the data path of host share
	// Request.Mount.Tag: after the request frame the stream carries raw
	// 9P2000.L both ways (the guest kernel is the client, the host's file
	// gateway the server) until either side closes it. The guest relays it
	// to a socketpair whose other end OpMount hands to the kernel.
	OpMountData = "mount-data"
	// OpMount (guest) mounts share Request.Mount.Tag, whose data stream
	// must already be open, at Request.Mount.Path; the guest answers one
	// FrameResult once the kernel has attached, or FrameError.
	OpMount = "mount"
	// OpUnmount (guest) detaches the virtio-fs bind at Request.Mount.Path
	// (lazily: a process with a file open or its working directory there
	// keeps its reference, and the host answers its next operation with
	// an error once it drops the mount's tree) and removes the mount point
	// if the agent made it; one FrameResult, or FrameError.
	OpUnmount = "unmount"
	// OpSettle (guest) waits, up to Request.LimitMS, until the kernel has
	// done the work it defers from boot (the refined clocksource, the NICs'
	// IPv6 link-local addresses) and answers with what is still pending
	// (Result.Pending; none when settled). The supervisor sends it before
	// it saves a boot template, so that restores do not redo that work.
	OpSettle = "settle"
	// OpDial (guest) connects to the guest's own loopback TCP port
	// Request.Port and, once connected, answers one FrameResult; the
	// stream then carries that connection's raw bytes both ways until
	// either side closes it. The supervisor's SSH server uses it for an
	// editor's port forward (VS Code's server listens on 127.0.0.1).
	OpDial = "dial"
)

// SFTPServerArgs is the exec that serves SFTP on its stdin and stdout in
// the guest: smx-agent itself, started again as the session's user (the
// exec's child resolves /proc/self/exe to the agent before it becomes
// anything else). The supervisor's SSH server runs it for the sftp
// subsystem, so scp and editors' file panes work on images without
// OpenSSH's sftp-server.
var SFTPServerArgs = []string{"/proc/self/exe", "sftp-server"}

// FrameType identifies a frame.
type FrameType byte

const (
	FrameRequest  FrameType = 1  // JSON Request, host → guest, first frame
	FrameStdin    FrameType = 2  // raw bytes, host → guest
	FrameStdinEOF FrameType = 3  // empty, host → guest
	FrameResize   FrameType = 4  // JSON WindowSize, host → guest
	FrameSignal   FrameType = 5  // JSON Signal, host → guest
	FrameStarted  FrameType = 6  // JSON Started, guest → host
	FrameStdout   FrameType = 7  // raw bytes, guest → host
	FrameStderr   FrameType = 8  // raw bytes, guest → host
	FrameExit     FrameType = 9  // JSON ExitStatus, guest → host
	FrameError    FrameType = 10 // JSON Error, either direction
	FrameData     FrameType = 11 // raw bytes (tar), either direction
	FrameEOF      FrameType = 12 // empty, end of FrameData
	FrameResult   FrameType = 13 // JSON Result, guest → host
)

func (t FrameType) String() string {
	switch t {
	case FrameRequest:
		return "request"
	case FrameStdin:
		return "stdin"
	case FrameStdinEOF:
		return "stdin-eof"
	case FrameResize:
		return "resize"
	case FrameSignal:
		return "signal"
	case FrameStarted:
		return "started"
	case FrameStdout:
		return "stdout"
	case FrameStderr:
		return "stderr"
	case FrameExit:
		return "exit"
	case FrameError:
		return "error"
	case FrameData:
		return "data"
	case FrameEOF:
		return "eof"
	case FrameResult:
		return "result"
	}
	return fmt.Sprintf("frame(%d)", byte(t))
}

// Request is the first frame of every stream.
type Request struct {
	Op string `json:"op"`

	// OpExec.
	Exec *ExecRequest `json:"exec,omitempty"`

	// OpCopyIn: directory to extract into. OpCopyOut: path to archive.
	Path string `json:"path,omitempty"`

	// OpSetTime: wall clock to set, Unix nanoseconds.
	TimeUnixNano int64 `json:"time_unix_nano,omitempty"`

	// OpAddEntropy: random bytes to credit to the guest's pool.
	Entropy []byte `json:"entropy,omitempty"`

	// OpInstallCA: the sandbox CA certificate, PEM.
	CACert []byte `json:"ca_cert,omitempty"`

	// OpSetHostname.
	Hostname string `json:"hostname,omitempty"`

	// OpInstallSSHCA: one known_hosts line, "@cert-authority * KEY COMMENT".
	SSHKnownHosts string `json:"ssh_known_hosts,omitempty"`
	// OpMount, OpMountData.
	Mount *MountRequest `json:"mount,omitempty"`
	// OpSettle: how long to wait at most, milliseconds.
	LimitMS int64 `json:"limit_ms,omitempty"`
	// OpDial: the loopback TCP port to connect to.
	Port uint16 `json:"port,omitempty"`
}

// MountRequest names a host share and where the guest mounts it.
type MountRequest struct {
	Tag      string `json:"tag"`                 // short name, unique per sandbox: [a-z0-9-]
	Path     string `json:"path,omitempty"`      // absolute guest mount point (OpMount)
	ReadOnly bool   `json:"read_only,omitempty"` // also mount read-only in the guest (the host enforces it anyway)
	MSize    int    `json:"msize,omitempty"`     // 9P message size; 0 = the guest's default
	// Addr and Port, when set, make OpMount connect over TCP to the file
	// gateway on the network gateway's address (no OpMountData stream).
	Addr string `json:"addr,omitempty"`
	Port int    `json:"port,omitempty"`
	// Relay, with Addr and Port, has smx-agent hold the TCP connection and
	// carry the kernel's 9P messages over it, so that the session can be
	// rebuilt on a new connection after a restore (open files survive).
	Relay bool `json:"relay,omitempty"`
	// VirtioFS, when set, is the tag of the sandbox's virtio-fs device:
	// the agent mounts the device once (its root holds one directory per
	// mount, named by Tag) and binds directory Tag at Path.
	VirtioFS string `json:"virtiofs,omitempty"`
	// Overlay, when set, is a guest path where the agent mounts an
	// overlay of the (read-only) share at Path under a writable layer of
	// the guest's own disk (OverlayUpper(Tag)), owned by UID:GID: a
	// read-only package cache the guest uses as a normal folder. What the
	// guest writes stays in that layer; the host takes from it only what
	// it verifies (internal/cache).
	Overlay string `json:"overlay,omitempty"`
	UID     uint32 `json:"uid,omitempty"`
	GID     uint32 `json:"gid,omitempty"`
}

// OverlayUpper is the guest folder holding what the guest wrote over the
// read-only share tag (OpCopyOut reads it when the sandbox stops).
func OverlayUpper(tag string) string { return "/var/lib/smx-cache/" + tag + "/upper" }

// ExecRequest describes a process to start in the guest.
type ExecRequest struct {
	Args []string `json:"args"`
	// Env entries "K=V"; added to a minimal default environment
	// (PATH, HOME, TERM when TTY) and override it.
	Env []string `json:"env,omitempty"`
	// Dir is the working directory; empty means the user's home or "/".
	Dir string `json:"dir,omitempty"`
	// User is a name or numeric uid[:gid]; empty means root.
	User string `json:"user,omitempty"`
	// TTY runs the process on a new pseudo-terminal; stdout carries the
	// terminal output and stderr is unused.
	TTY bool `json:"tty,omitempty"`
	// Size is the initial window size when TTY is set.
	Size *WindowSize `json:"size,omitempty"`
	// Stdin: when false the process gets /dev/null as stdin and the host
	// sends no stdin frames.
	Stdin bool `json:"stdin,omitempty"`
	// Root, when set, runs the process chrooted to this guest directory
	// (a container's root file system in a pod): its user, PATH lookup
	// and working directory are resolved inside Root, and the guest's
	// /proc, /sys and /dev are mounted into Root before the first process
	// there starts.
	Root string `json:"root,omitempty"`
	// Rlimits are set on the process (prlimit) as soon as it has started.
	Rlimits []Rlimit `json:"rlimits,omitempty"`
}

// Rlimit is one resource limit: Resource is Linux's RLIMIT_* number.
type Rlimit struct {
	Resource int    `json:"resource"`
	Soft     uint64 `json:"soft"`
	Hard     uint64 `json:"hard"`
}

// WindowSize is a terminal size.
type WindowSize struct {
	Rows uint16 `json:"rows"`
	Cols uint16 `json:"cols"`
}

// Signal asks the guest to deliver a signal to the process (group).
type Signal struct {
	Signal int `json:"signal"`
}

// Started reports the guest PID of a started process.
type Started struct {
	PID int `json:"pid"`
}

// ExitStatus is how a process ended. Signal is non-zero when it was killed
// by a signal; Code is then 128+Signal, as a shell reports it.
type ExitStatus struct {
	Code   int `json:"code"`
	Signal int `json:"signal,omitempty"`
}

// Error is a failure reported by the peer.
type Error struct {
	Message string `json:"message"`
	// ExitCode is what a shell would exit with for an exec that could not
	// start its command: 127 not found, 126 found but not executable; 0
	// for every other error.
	ExitCode int `json:"exit_code,omitempty"`
	// Class is the error's errdefs class (errdefs.Class), so that the
	// receiver's errors.Is, exit code and HTTP status follow from it.
	Class string `json:"class,omitempty"`
}

func (e *Error) Error() string { return e.Message }

// Unwrap returns the errdefs class the error carries (nil without one).
func (e *Error) Unwrap() error { return errdefs.FromClass(e.Class) }

// ErrorOf is err as a FrameError payload, its class kept.
func ErrorOf(err error) Error {
	var pe *Error
	if errors.As(err, &pe) {
		return Error{Message: err.Error(), ExitCode: pe.ExitCode, Class: errdefs.Class(err)}
	}
	return Error{Message: err.Error(), Class: errdefs.Class(err)}
}

// Result is the answer to a one-shot request.
type Result struct {
	OK bool `json:"ok"`
	// OpHealth.
	Kernel   string  `json:"kernel,omitempty"`   // /proc/version
	Uptime   float64 `json:"uptime,omitempty"`   // seconds
	Hostname string  `json:"hostname,omitempty"` //
	// OpCopyIn: bytes written.
	Bytes int64 `json:"bytes,omitempty"`
	// OpSettle: the deferred boot work not done when it answered.
	Pending []string `json:"pending,omitempty"`
}

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, t FrameType, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("agentproto: frame %s too large: %d bytes", t, len(payload))
	}
	var hdr [5]byte
	hdr[0] = byte(t)
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if len(payload) == 0 {
		_, err := w.Write(hdr[:])
		return err
	}
	// One Write per frame keeps frames atomic on a shared writer guarded by
	// the caller's mutex, and halves the yamux frame count.
	buf := make([]byte, 5+len(payload))
	copy(buf, hdr[:])
	copy(buf[5:], payload)
	_, err := w.Write(buf)
	return err
}

// WriteJSON writes one frame with a JSON payload.
func WriteJSON(w io.Writer, t FrameType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("agentproto: encode %s: %w", t, err)
	}
	return WriteFrame(w, t, b)
}

// ReadFrame reads one frame. buf is reused when large enough.
func ReadFrame(r io.Reader, buf []byte) (FrameType, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("agentproto: frame %s too large: %d bytes", FrameType(hdr[0]), n)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return FrameType(hdr[0]), buf, nil
}

// ReadRequest reads the first frame of a stream.
func ReadRequest(r io.Reader) (*Request, error) {
	t, p, err := ReadFrame(r, nil)
	if err != nil {
		return nil, err
	}
	if t != FrameRequest {
		return nil, fmt.Errorf("agentproto: expected request frame, got %s", t)
	}
	var req Request
	if err := json.Unmarshal(p, &req); err != nil {
		return nil, fmt.Errorf("agentproto: decode request: %w", err)
	}
	return &req, nil
}

// ReadResult reads the answer to a one-shot request: a FrameResult, or a
// FrameError returned as the peer's error.
func ReadResult(r io.Reader) (*Result, error) {
	t, p, err := ReadFrame(r, nil)
	if err != nil {
		return nil, err
	}
	switch t {
	case FrameResult:
		var res Result
		if err := json.Unmarshal(p, &res); err != nil {
			return nil, fmt.Errorf("agentproto: decode result: %w", err)
		}
		return &res, nil
	case FrameError:
		return nil, DecodeError(p)
	}
	return nil, fmt.Errorf("agentproto: expected a result, got a %s frame", t)
}

// DecodeError turns a FrameError payload into an error.
func DecodeError(p []byte) error {
	var e Error
	if err := json.Unmarshal(p, &e); err != nil || e.Message == "" {
		return &Error{Message: "agentproto: malformed error frame"}
	}
	return &e
}

// FrameWriter adapts a frame type to io.Writer, splitting into DataChunk
// frames. It is how stdout, stdin and tar data are streamed.
type FrameWriter struct {
	W    io.Writer
	Type FrameType
}

func (f FrameWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), DataChunk)
		if err := WriteFrame(f.W, f.Type, p[:c]); err != nil {
			return n, err
		}
		n += c
		p = p[c:]
	}
	return n, nil
}

// LockedWriter serialises whole frames from several goroutines (stdout and
// stderr pumps, the exit reporter) onto one stream.
type LockedWriter struct {
	mu sync.Mutex
	W  io.Writer
}

func (l *LockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.W.Write(p)
}
