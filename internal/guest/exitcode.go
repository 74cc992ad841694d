package guest

import (
	"errors"
	"io/fs"
	"os/exec"
	"syscall"
)

// errStart marks an exec that failed to start its command, as opposed to
// a bad request or a broken stream.
type errStart struct{ err error }

func (e *errStart) Error() string { return e.err.Error() }
func (e *errStart) Unwrap() error { return e.err }

// startExitCode is the exit status a shell (and docker) gives a command
// that cannot start: 127 when it is not found, 126 when it is found but
// cannot be executed. Other errors get 0.
func startExitCode(err error) int {
	var ee *exec.Error
	var se *errStart
	if !errors.As(err, &ee) && !errors.As(err, &se) {
		return 0
	}
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return 127
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENOEXEC),
		errors.Is(err, syscall.ETXTBSY), errors.Is(err, syscall.ENOTDIR):
		return 126
	}
	return 0
}
