package supervisor

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// vmExitGrace is how long a failed boot step waits for QEMU to finish
// dying: the control channel reports EOF a moment before QEMU's exit is
// reaped, and QEMU's own error is the one worth showing.
const vmExitGrace = 3 * time.Second

// vmExited returns QEMU's own last error when the machine has exited or
// exits within grace, else nil. A guest agent that "closed the control
// channel" during boot almost always means QEMU died ("cannot set up guest
// memory ...: Cannot allocate memory"), and that line is what the user
// can act on.
func (s *Supervisor) vmExited(grace time.Duration) error {
	if s.machine == nil {
		return nil
	}
	// Done first: with grace 0 both cases of one select are ready and Go
	// picks either (a dead QEMU was reported as "supervisor: <nil>").
	select {
	case <-s.machine.Done():
	default:
		select {
		case <-s.machine.Done():
		case <-time.After(grace):
			return nil
		}
	}
	return errors.New(qemuExitMessage("QEMU exited during boot", s.machine.Wait(), s.machine.Stderr()))
}

// qemuExitMessage is "WHAT: QEMU's last line", or "WHAT (how it ended)"
// when QEMU said nothing.
func qemuExitMessage(what string, waitErr error, stderr string) string {
	if tail := strings.TrimSpace(stderr); tail != "" {
		return fmt.Sprintf("%s: %s", what, strings.TrimPrefix(lastLine(tail), "qemu-system-x86_64: "))
	}
	status := "exit status 0"
	if waitErr != nil {
		status = waitErr.Error()
	}
	return fmt.Sprintf("%s (%s)", what, status)
}
