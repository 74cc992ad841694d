// Package supervisor runs one sandbox: it boots QEMU, holds the control
// channel to the guest agent, serves the sandbox's API socket, and records
// the truth about the sandbox in its state file. It runs as a detached
// process (the smx binary's hidden `__supervise` verb), one per sandbox, so
// a crash affects one sandbox only.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/netstack"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/tlsgw"
	"github.com/smx-dev/smx/internal/virtiofs"
	"github.com/smx-dev/smx/internal/vm"
)

// Options configure one supervisor run.
type Options struct {
	State     statedir.Dir
	Name      string
	AgentPath string // static smx-agent binary for the initramfs
	Logger    *slog.Logger
	// Ready receives "ok\n" once the guest answers, or one line of error;
	// then it is closed. It is how the starting CLI learns the outcome.
	Ready       io.WriteCloser
	BootTimeout time.Duration
	// Cold boots the guest even when a boot template could be restored.
	Cold bool
	// Owner, when set, is the read end of the owner pipe of a sandbox
	// that belongs to one CLI (`smx run`): end of file on it means that
	// CLI is gone, and the supervisor stops and removes the sandbox.
	Owner io.ReadCloser
	// LogCreate: the sandbox was created without its sandbox.create
	// record (smx run), which this supervisor writes first in the log.
	LogCreate bool
}

// Supervisor is one running sandbox.
type Supervisor struct {
	vfs *virtiofs.Server // the virtio-fs device's server, when mounts use it
	// qemuPID is QEMU's process, for the virtio-fs backend's check that
	// guest RAM is mapped shared (0 until QEMU runs).
	qemuPID atomic.Int64

	opts    Options
	log     *slog.Logger
	paths   sandbox.Paths
	spec    sandbox.Spec
	self    audit.Identity // which records of the log are this sandbox's own (smx-why); set with spec, never changed
	state   sandbox.State
	stateMu sync.Mutex

	machine *vm.Machine
	// session is the control session to the guest agent: replaced by
	// newSession (from the boot's goroutine, or a reconnect), ended by
	// endSessions; read it through currentSession.
	sessMu        sync.Mutex
	session       *yamux.Session
	sessionsEnded bool

	ctlConn net.Conn      // host end of the control channel; sessions come and go on it
	host    snapshot.Host // what a state saved by this QEMU needs to be restored
	restore *restorePlan  // non-nil when this run loads a saved state instead of booting
	opMu    sync.Mutex    // serialises pause, resume, suspend and snapshot
	log_    *audit.Log    // the sandbox's tamper-evident log; this process is its only writer while it runs; read once logOpen is closed
	logOpen chan struct{} // closed once openLog has finished (log_ and logErr set)
	logErr  error
	net     *netstack.Stack
	// netReady is net once it is up, for the published ports' goroutines.
	netReady atomic.Pointer[netstack.Stack]
	ports    *publish.Server // the published ports (ports.go); changed under opMu
	profile  *policy.Profile
	ca       *tlsgw.CA // the sandbox's CA for credential brokering; its certificate goes into the guest
	git      *gitgw.Gateway
	fresh    *creds.Refresher            // keeps the profile's sign-ins fresh while the sandbox runs
	ssh      sshParts                    // the SSH gateway (ssh.go)
	shares   shareSet                    // host folders (files.go)
	view     atomic.Pointer[profileView] // what the log needs of the profile (name, redaction); swapped on a profile change
	stored   storedSecrets               // the host's credential values, redacted from recorded command lines (redact.go)

	stopOnce   sync.Once
	stopping   chan struct{} // closed when a stop was asked for
	stopDone   chan struct{} // closed when the machine is down after a stop
	stopErr    error         // why the machine ended otherwise than asked, or its state could not be written
	viaErr     error         // the state finish could not write
	cleanups   []func() error
	cleanupsMu sync.Mutex
	discarded  bool        // a throwaway sandbox: remove it once down (owner.go)
	ownedDir   os.FileInfo // the sandbox directory this supervisor may remove
	listener   net.Listener
	handlers   sync.WaitGroup // in-flight API requests

	// bgCtx bounds the run-state operations and the background guest
	// syncs; a stop cancels it, so it never waits behind a long save
	// (which is abandoned: nothing is saved). bg tracks the syncs.
	bgCtx    context.Context
	cancelBg context.CancelFunc
	bg       sync.WaitGroup

	profMu sync.Mutex // serialises profile changes (setProfile)

	askOnce sync.Once
	asks    *approval.Holder // questions the gateways hold for the host user (approvals.go)

	// firstStart: the sandbox was never started (it may use a template);
	// saveTemplateAs names the template to save once a cold boot answers.
	firstStart     bool
	saveTemplateAs string
	// slimming tracks a template's conversion to its shared-RAM form
	// (slimTemplate), which the process waits for before it exits.
	slimming sync.WaitGroup

	act activity // what --idle-stop watches (limits.go)

	tracing bool // SMX_TRACE=1: log the start's phases (trace)
}

// procStart is about when this process started: the origin of the start's
// trace (SMX_TRACE=1).
var procStart = time.Now()

// trace notes, with SMX_TRACE=1 in the supervisor's environment, how long
// after the process started the sandbox's start reached phase (in
// supervisor.log); it is how the start path is profiled.
func (s *Supervisor) trace(phase string) {
	if s.tracing {
		s.log.Info("trace", "phase", phase, "ms", float64(time.Since(procStart).Microseconds())/1000)
	}
}

func (s *Supervisor) defer_(f func() error) {
	s.cleanupsMu.Lock() // the gateway is set up beside the boot
	defer s.cleanupsMu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

// close runs the cleanups in reverse order and joins their errors.
func (s *Supervisor) close() error {
	var errs []error
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		if err := s.cleanups[i](); err != nil {
			errs = append(errs, err)
		}
	}
	s.cleanups = nil
	return errors.Join(errs...)
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func firstLine(err error) string {
	if err == nil {
		return "ok"
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// AgentPath finds the smx-agent binary: $SMX_AGENT, else next to the smx
// executable.
func AgentPath() (string, error) {
	if p := os.Getenv("SMX_AGENT"); p != "" {
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), "smx-agent")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("supervisor: smx-agent not found next to %s: build it with `make` or set SMX_AGENT: %w", exe, errdefs.ErrUnavailable)
	}
	return p, nil
}
