// The sandbox's state as this supervisor holds it, and the one way it
// writes it: the state table's events (sandbox.Apply).

package supervisor

import (
	"fmt"

	"github.com/smx-dev/smx/internal/sandbox"
)

// The sandbox's state changes only through the state table's events
// (sandbox.Apply): apply writes an event, noteEvent notes one in memory,
// update and noteState change the other fields. What is noted in memory
// only is written with the next write: it saves the start a write (and
// its fsyncs) where nobody needs the change on disk before the next one.

// apply moves the state as event ev says, lets fill set what the event
// brings, and writes it. The change is kept in memory even when it could
// not be written (it happened); the error, a refusal or a failed write,
// is the caller's to report: an operation fails with it.
func (s *Supervisor) apply(ev sandbox.Event, fill func(*sandbox.State)) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	next, err := sandbox.Change(s.paths, s.state, ev, fill)
	s.state = next
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	return nil
}

// noteEvent is apply in memory only.
func (s *Supervisor) noteEvent(ev sandbox.Event, fill func(*sandbox.State)) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	next, err := sandbox.Apply(s.state, ev)
	if err != nil {
		return err
	}
	if fill != nil {
		to := next.Status
		fill(&next)
		next.Status = to
	}
	s.state = next
	return nil
}

// update changes fields of the state other than its status and writes
// it; the change is kept in memory when it cannot be written.
func (s *Supervisor) update(fill func(*sandbox.State)) error {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	next, err := sandbox.Update(s.paths, s.state, fill)
	s.state = next
	if err != nil {
		return fmt.Errorf("supervisor: %w", err)
	}
	return nil
}

// noteState is update in memory only.
func (s *Supervisor) noteState(fill func(*sandbox.State)) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	st := s.state.Status
	fill(&s.state)
	s.state.Status = st
}

// status is the sandbox's status as this supervisor holds it.
func (s *Supervisor) status() sandbox.Status {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	return s.state.Status
}

// check is the state table's word on op against the state this
// supervisor holds (the caller checked it against state.json before).
func (s *Supervisor) check(op sandbox.Op) (sandbox.Transition, error) {
	s.stateMu.Lock()
	in := &sandbox.Info{Spec: s.spec, State: s.state}
	s.stateMu.Unlock()
	return sandbox.Check(in, op)
}
