package supervisor

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/sandbox"
)

// activity is what --idle-stop watches: the time of the last activity and
// the number of execs running now. Activity is
//   - an exec running, for its whole life (each counts from its start to
//     its end), except the agent's own execs (passiveLabel): the agent's
//     start, its attached terminal and the wait for its end; a copy in or
//     out (`smx agent cp`) likewise;
//   - output (stdout or stderr) of any exec, so an attached agent that
//     prints is active and one that sits silent is not;
//   - a TCP or UDP packet between the guest and the gateway (netstack's
//     Activity hook), in either direction.
type activity struct {
	last  atomic.Int64 // unix nanoseconds
	execs atomic.Int32 // execs and copies running (active)
}

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// active: request r keeps the sandbox from being idle while it runs.
func active(r *agentproto.Request, label string) bool {
	switch r.Op {
	case agentproto.OpExec:
		return !passiveLabel(label)
	case agentproto.OpCopyIn, agentproto.OpCopyOut:
		return true
	}
	return false // a health check is not
}

// passiveLabel: execs that belong to an agent run by a preset, which run
// as long as the agent does and so would never let it be idle.
func passiveLabel(label string) bool {
	return label == "agent" || label == "attach" || label == "agent-wait"
}

// idleCheck is how often --idle-stop looks: a tenth of the limit, between
// a second and half a minute, so a limit fires at most 10% (or 1 s) late
// and a long one costs next to nothing.
func idleCheck(limit time.Duration) time.Duration {
	return min(max(limit/10, time.Second), 30*time.Second)
}

// watchLimits enforces the spec's --timeout and --idle-stop on this run:
// the timeout counts from this start (a pause included), the idle time
// from the last activity (a paused guest does nothing, so it counts as
// idle). Reaching either writes its record, says why in the state and
// stops the sandbox as `smx agent stop` does; removal (--rm, smx run)
// stays with whoever removes it after any stop.
func (s *Supervisor) watchLimits() {
	timeout, idle := time.Duration(s.spec.Timeout), time.Duration(s.spec.IdleStop)
	if timeout <= 0 && idle <= 0 {
		return
	}
	var deadline <-chan time.Time
	if timeout > 0 {
		s.stateMu.Lock()
		started := s.state.Started
		s.stateMu.Unlock()
		t := time.NewTimer(timeout - time.Since(started))
		defer t.Stop()
		deadline = t.C
	}
	var tick <-chan time.Time
	if idle > 0 {
		s.act.touch() // the start is the first activity
		t := time.NewTicker(idleCheck(idle))
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-s.stopping:
			return
		case <-deadline:
			reason := fmt.Sprintf("--timeout %s reached", sandbox.Duration(timeout))
			s.log.Info("stopping: " + reason)
			s.audit(audit.KindSandboxTimeout, map[string]any{"limit": sandbox.Duration(timeout).String(), "limit_ms": timeout.Milliseconds()})
			s.stopFor(reason)
			return
		case <-tick:
			if s.act.execs.Load() > 0 {
				continue
			}
			since := time.Unix(0, s.act.last.Load())
			if time.Since(since) < idle {
				continue
			}
			reason := fmt.Sprintf("--idle-stop %s reached", sandbox.Duration(idle))
			s.log.Info("stopping: " + reason)
			s.audit(audit.KindSandboxIdle, map[string]any{"limit": sandbox.Duration(idle).String(), "limit_ms": idle.Milliseconds(),
				"idle_since": since.UTC().Format(time.RFC3339Nano)})
			s.stopFor(reason)
			return
		}
	}
}

// stopFor stops the sandbox, leaving reason in its state for the CLIs
// that were attached to it.
func (s *Supervisor) stopFor(reason string) {
	if isDone(s.stopping) {
		return // someone else stopped it first
	}
	s.noteState(func(st *sandbox.State) { st.StopReason = reason })
	s.stop(30 * time.Second)
}
