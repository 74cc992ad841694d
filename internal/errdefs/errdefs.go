// Package errdefs holds the few error classes smx uses. Errors are wrapped
// with context ("pkg: op: detail: %w") and tested with errors.Is.
package errdefs

import "errors"

var (
	ErrNotFound    = errors.New("not found")
	ErrExists      = errors.New("already exists")
	ErrInvalid     = errors.New("invalid argument")
	ErrInUse       = errors.New("in use")
	ErrUnavailable = errors.New("unavailable") // a requirement (QEMU, kernel, guest agent) is missing or not answering
	ErrDenied      = errors.New("denied")
	ErrFailed      = errors.New("failed precondition") // wrong state, e.g. exec on a stopped sandbox
)
