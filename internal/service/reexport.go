package service

import (
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
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
)

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
