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

// classes names each class for protocols (the supervisor's socket, the
// HTTP API): the class travels as this word, so the receiver's errors.Is
// and exit or status code follow from it.
var classes = []struct {
	name string
	err  error
}{
	{"not_found", ErrNotFound},
	{"exists", ErrExists},
	{"invalid", ErrInvalid},
	{"in_use", ErrInUse},
	{"unavailable", ErrUnavailable},
	{"denied", ErrDenied},
	{"failed_precondition", ErrFailed},
}

// Class returns the name of err's class, "" when it has none.
func Class(err error) string {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return ""
}

// FromClass returns the class named by Class, nil for "" or an unknown name.
func FromClass(name string) error {
	for _, c := range classes {
		if c.name == name {
			return c.err
		}
	}
	return nil
}

// Classes lists the class names, for documentation and tests.
func Classes() []string {
	out := make([]string, len(classes))
	for i, c := range classes {
		out[i] = c.name
	}
	return out
}
