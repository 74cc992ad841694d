package service

import (
	"os"

	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/ocisnap"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
)

// The lower layers' types and checks that the service's results and
// requests are made of, re-exported so that a caller (the CLI) depends on
// the service alone. They are the same types: values pass unconverted.
type (
	// SandboxInfo is a sandbox's spec and state, as Inspect returns it.
	SandboxInfo = sandbox.Info
	// SandboxSpec is a sandbox's settings.
	SandboxSpec = sandbox.Spec
	// SandboxStatus is a sandbox's lifecycle status.
	SandboxStatus = sandbox.Status
	// Worktree is the git worktree a sandbox was created on.
	Worktree = sandbox.Worktree
	// LogRecord is one record of a sandbox's signed log, as Logs gives it.
	LogRecord = audit.Record
	// LogFilter selects the records Logs gives.
	LogFilter = audit.Filter
	// Port is a port as published (-p), HostPort 0 for any free one.
	Port = publish.Port
	// PortBinding is a published port with the host port it is served on.
	PortBinding = publish.Binding
	// PushResult is what a snapshot or template push sent and where.
	PushResult = ocisnap.PushResult
	// Approval is a question a gateway holds for the host user's answer.
	Approval = approval.Approval
	// Profile is a resolved security profile, as ResolveProfile gives it.
	Profile = policy.Profile
	// ProfileChange is one rule B adds to or removes from A (DiffProfiles).
	ProfileChange = policy.Change
	// StateDir is a state directory (STATE).
	StateDir = statedir.Dir
	// FileLock is a held lock on a file (TryLock).
	FileLock = statedir.Lock
)

// Answers to an approval.
const (
	DecideDeny    = approval.Deny
	DecideOnce    = approval.Once
	DecideSandbox = approval.Sandbox
	DecideAlways  = approval.Always
)

// ErrLocked is TryLock's error when another process holds the lock.
var ErrLocked = statedir.ErrLocked

// DiffProfiles is what B adds to and removes from A, rule by rule
// (`smx profile diff`); the order of rules is never a difference.
func DiffProfiles(a, b *Profile) []ProfileChange { return policy.Diff(a, b) }

// DefaultStateDir is the state directory smx uses when none is named.
func DefaultStateDir() (StateDir, error) { return statedir.Default() }

// TryLock takes the lock on path, or fails with ErrLocked at once.
func TryLock(path string) (*FileLock, error) { return statedir.TryLock(path) }

// WriteFileAtomic writes a file whole or not at all.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	return statedir.WriteFileAtomic(path, data, perm)
}

// Statuses a caller tells apart.
const (
	StatusBlocked = sandbox.StatusBlocked
	StatusPaused  = sandbox.StatusPaused
)

// ValidName checks a sandbox name (sandbox.ValidName).
func ValidName(name string) error { return sandbox.ValidName(name) }

// ParseLimit reads a --timeout or --idle-stop value (sandbox.ParseLimit);
// flag names it in the error.
func ParseLimit(flag, s string) (sandbox.Duration, error) { return sandbox.ParseLimit(flag, s) }
