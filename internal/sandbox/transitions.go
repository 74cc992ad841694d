package sandbox

import (
	"fmt"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
)

// This file is the sandbox state machine: one table says, for every
// status and every operation, what the operation does or how it is
// refused. The service layer (internal/service) checks it before each
// operation and the supervisor checks it again for the operations it
// carries out, against the status it holds, so that the two cannot
// disagree. docs/architecture.md prints the table.

// StatusRemoving: `rm` has begun; the sandbox directory goes next. Seen
// only when a removal was interrupted (another `rm` finishes it).
const StatusRemoving Status = "removing"

// Statuses lists every status, in the order of a sandbox's life.
var Statuses = []Status{
	StatusCreated, StatusStarting, StatusRunning, StatusPaused, StatusBlocked,
	StatusSuspended, StatusStopping, StatusStopped, StatusCrashed, StatusRemoving,
}

// Live reports whether a supervisor must be running for a sandbox to be in
// status s. A live status whose supervisor is gone reads as crashed.
func (s Status) Live() bool {
	switch s {
	case StatusStarting, StatusRunning, StatusPaused, StatusBlocked, StatusStopping:
		return true
	}
	return false
}

// Op is a lifecycle operation on an existing sandbox.
type Op string

const (
	OpStart       Op = "start"
	OpStop        Op = "stop"
	OpRemove      Op = "rm"
	OpForceRemove Op = "rm -f"
	OpExec        Op = "exec" // also cp and shell: anything that needs the guest agent
	OpPause       Op = "pause"
	OpResume      Op = "resume"
	OpSuspend     Op = "suspend"
	OpSnapshot    Op = "snapshot"
	OpPolicy      Op = "policy"
	OpPort        Op = "port" // publish or withdraw a port (`smx agent port add|rm`)
)

// Ops lists every operation the table covers.
var Ops = []Op{OpStart, OpStop, OpRemove, OpForceRemove, OpExec, OpPause, OpResume, OpSuspend, OpSnapshot, OpPolicy, OpPort}

// Transition is what an allowed operation does.
type Transition struct {
	// Via is the status the sandbox passes through ("" for none), To the
	// one the operation leaves it in. A removed sandbox is gone: To is "".
	Via Status `json:"via,omitempty"`
	To  Status `json:"to,omitempty"`
	// NoOp: the sandbox already is where the operation would take it;
	// the operation succeeds without doing anything.
	NoOp bool `json:"noop,omitempty"`
	// Supervisor: the sandbox's running supervisor carries it out (it
	// holds the machine and the log); otherwise the caller does.
	Supervisor bool `json:"supervisor,omitempty"`
}

// rule is one cell of the table: a transition, or the class of the
// error that refuses the operation.
type rule struct {
	t   Transition
	err error
}

func to(via, st Status) rule  { return rule{t: Transition{Via: via, To: st}} }
func sup(via, st Status) rule { return rule{t: Transition{Via: via, To: st, Supervisor: true}} }
func noop(st Status) rule     { return rule{t: Transition{To: st, NoOp: true}} }
func refuse(class error) rule { return rule{err: class} }
func gone(via Status) rule    { return rule{t: Transition{Via: via}} }
func supGone(via Status) rule { return rule{t: Transition{Via: via, Supervisor: true}} }
func supNoop(st Status) rule  { return rule{t: Transition{To: st, NoOp: true, Supervisor: true}} }
func supStay(st Status) rule  { return rule{t: Transition{To: st, Supervisor: true}} }
func stay(st Status) rule     { return rule{t: Transition{To: st}} }

var (
	failed   = refuse(errdefs.ErrFailed)
	inUse    = refuse(errdefs.ErrInUse)
	conflict = refuse(errdefs.ErrExists)
)

// table is the state machine. A status or operation missing from it is a
// bug, which TestTableComplete catches.
var table = map[Status]map[Op]rule{
	StatusCreated: {
		OpStart: to(StatusStarting, StatusRunning), OpStop: noop(StatusCreated),
		OpRemove: gone(StatusRemoving), OpForceRemove: gone(StatusRemoving),
		OpExec: failed, OpPause: failed, OpResume: failed, OpSuspend: failed, OpSnapshot: failed,
		OpPolicy: stay(StatusCreated), OpPort: stay(StatusCreated),
	},
	StatusStarting: {
		OpStart: conflict, OpStop: sup(StatusStopping, StatusStopped),
		OpRemove: inUse, OpForceRemove: supGone(StatusStopping),
		OpExec: failed, OpPause: failed, OpResume: failed, OpSuspend: failed, OpSnapshot: failed,
		OpPolicy: failed, OpPort: failed,
	},
	StatusRunning: {
		OpStart: conflict, OpStop: sup(StatusStopping, StatusStopped),
		OpRemove: inUse, OpForceRemove: supGone(StatusStopping),
		OpExec: supStay(StatusRunning), OpPause: sup("", StatusPaused), OpResume: supNoop(StatusRunning),
		OpSuspend: sup(StatusStopping, StatusSuspended), OpSnapshot: supStay(StatusRunning),
		OpPolicy: supStay(StatusRunning), OpPort: supStay(StatusRunning),
	},
	StatusPaused: {
		OpStart: conflict, OpStop: sup(StatusStopping, StatusStopped),
		OpRemove: inUse, OpForceRemove: supGone(StatusStopping),
		OpExec: failed, OpPause: supNoop(StatusPaused), OpResume: sup("", StatusRunning),
		OpSuspend: sup(StatusStopping, StatusSuspended), OpSnapshot: supStay(StatusPaused),
		OpPolicy: supStay(StatusPaused), OpPort: supStay(StatusPaused),
	},
	StatusBlocked: {
		OpStart: conflict, OpStop: sup(StatusStopping, StatusStopped),
		OpRemove: inUse, OpForceRemove: supGone(StatusStopping),
		OpExec: failed, OpPause: failed, OpResume: sup("", StatusRunning), OpSuspend: failed, OpSnapshot: failed,
		OpPolicy: supStay(StatusBlocked), OpPort: supStay(StatusBlocked),
	},
	StatusSuspended: {
		OpStart: to(StatusStarting, StatusRunning), OpStop: to("", StatusStopped),
		OpRemove: gone(StatusRemoving), OpForceRemove: gone(StatusRemoving),
		OpExec: failed, OpPause: failed, OpResume: to(StatusStarting, StatusRunning), OpSuspend: failed, OpSnapshot: failed,
		OpPolicy: stay(StatusSuspended), OpPort: stay(StatusSuspended),
	},
	StatusStopping: {
		OpStart: conflict, OpStop: sup("", StatusStopped),
		OpRemove: inUse, OpForceRemove: supGone(StatusStopping),
		OpExec: failed, OpPause: failed, OpResume: failed, OpSuspend: failed, OpSnapshot: failed,
		OpPolicy: failed, OpPort: failed,
	},
	StatusStopped: {
		OpStart: to(StatusStarting, StatusRunning), OpStop: noop(StatusStopped),
		OpRemove: gone(StatusRemoving), OpForceRemove: gone(StatusRemoving),
		OpExec: failed, OpPause: failed, OpResume: failed, OpSuspend: failed, OpSnapshot: failed,
		OpPolicy: stay(StatusStopped), OpPort: stay(StatusStopped),
	},
	StatusCrashed: {
		OpStart: to(StatusStarting, StatusRunning), OpStop: noop(StatusCrashed),
		OpRemove: gone(StatusRemoving), OpForceRemove: gone(StatusRemoving),
		OpExec: failed, OpPause: failed, OpResume: failed, OpSuspend: failed, OpSnapshot: failed,
		OpPolicy: stay(StatusCrashed), OpPort: stay(StatusCrashed),
	},
	StatusRemoving: {
		OpStart: failed, OpStop: noop(StatusRemoving),
		OpRemove: gone(""), OpForceRemove: gone(""),
		OpExec: failed, OpPause: failed, OpResume: failed, OpSuspend: failed, OpSnapshot: failed,
		OpPolicy: failed, OpPort: failed,
	},
}

// Event is a change of a sandbox's status: a step of an operation (the
// Via and To of its Transition) or something that happens to the
// sandbox unasked (its guest answers, its machine dies, its disk fills).
// Apply is the one way a status changes; the events table below says,
// for every status and every event, where the event leaves the sandbox
// or how it is refused.
type Event string

const (
	// EventLaunched: a supervisor took the sandbox and starts its machine
	// (a start, or the resume of a suspended sandbox).
	EventLaunched Event = "launched"
	// EventBooted: the guest answers (booted, or its saved state loaded).
	EventBooted Event = "booted"
	// EventCrashed: the boot failed, or the machine or the supervisor died
	// unasked.
	EventCrashed Event = "crashed"
	// EventBlocked: QEMU stopped the guest on a host I/O error on its disk.
	EventBlocked Event = "blocked"
	// EventUnblocked: the failed I/O went through when retried (resume).
	EventUnblocked Event = "unblocked"
	// EventPaused, EventResumed: the vCPUs were stopped, or continued.
	EventPaused  Event = "paused"
	EventResumed Event = "resumed"
	// EventStopping: the supervisor began to end the machine (a stop, a
	// suspend, a snapshot --stop).
	EventStopping Event = "stopping"
	// EventStopped: the machine is down after a stop, or a suspended
	// sandbox's saved state was dropped.
	EventStopped Event = "stopped"
	// EventSuspended: the guest's state is saved and the machine is down.
	EventSuspended Event = "suspended"
	// EventDiscarded: the supervisor ends its throwaway sandbox (`smx run`)
	// and removes it before it exits.
	EventDiscarded Event = "discarded"
	// EventRemoving: `rm` began on a sandbox no supervisor runs.
	EventRemoving Event = "removing"
)

// Events lists every event the table covers.
var Events = []Event{
	EventLaunched, EventBooted, EventCrashed, EventBlocked, EventUnblocked, EventPaused, EventResumed,
	EventStopping, EventStopped, EventSuspended, EventDiscarded, EventRemoving,
}

// becomes is an event's cell of the table: the status it leaves.
func becomes(st Status) rule { return rule{t: Transition{To: st}} }

// events is the state machine's other half: what happens to a sandbox.
// A sandbox is born created (Manager.Create); from there only these
// events move it. Every step of an operation in table is one of them
// (TestEventsCarryOperations).
var events = map[Status]map[Event]rule{
	StatusCreated: {
		EventLaunched: becomes(StatusStarting), EventBooted: failed, EventCrashed: failed,
		EventBlocked: failed, EventUnblocked: failed, EventPaused: failed, EventResumed: failed,
		EventStopping: failed, EventStopped: failed, EventSuspended: failed,
		EventDiscarded: failed, EventRemoving: becomes(StatusRemoving),
	},
	StatusStarting: {
		EventLaunched: conflict, EventBooted: becomes(StatusRunning), EventCrashed: becomes(StatusCrashed),
		EventBlocked: failed, EventUnblocked: failed, EventPaused: failed, EventResumed: failed,
		EventStopping: becomes(StatusStopping), EventStopped: failed, EventSuspended: failed,
		EventDiscarded: becomes(StatusRemoving), EventRemoving: inUse,
	},
	StatusRunning: {
		EventLaunched: conflict, EventBooted: failed, EventCrashed: becomes(StatusCrashed),
		EventBlocked: becomes(StatusBlocked), EventUnblocked: failed, EventPaused: becomes(StatusPaused), EventResumed: failed,
		EventStopping: becomes(StatusStopping), EventStopped: failed, EventSuspended: failed,
		EventDiscarded: becomes(StatusRemoving), EventRemoving: inUse,
	},
	StatusPaused: {
		EventLaunched: conflict, EventBooted: failed, EventCrashed: becomes(StatusCrashed),
		EventBlocked: becomes(StatusBlocked), EventUnblocked: failed, EventPaused: failed, EventResumed: becomes(StatusRunning),
		EventStopping: becomes(StatusStopping), EventStopped: failed, EventSuspended: failed,
		EventDiscarded: becomes(StatusRemoving), EventRemoving: inUse,
	},
	StatusBlocked: {
		EventLaunched: conflict, EventBooted: failed, EventCrashed: becomes(StatusCrashed),
		EventBlocked: failed, EventUnblocked: becomes(StatusRunning), EventPaused: failed, EventResumed: failed,
		EventStopping: becomes(StatusStopping), EventStopped: failed, EventSuspended: failed,
		EventDiscarded: becomes(StatusRemoving), EventRemoving: inUse,
	},
	StatusSuspended: {
		EventLaunched: becomes(StatusStarting), EventBooted: failed, EventCrashed: failed,
		EventBlocked: failed, EventUnblocked: failed, EventPaused: failed, EventResumed: failed,
		EventStopping: failed, EventStopped: becomes(StatusStopped), EventSuspended: failed,
		EventDiscarded: failed, EventRemoving: becomes(StatusRemoving),
	},
	StatusStopping: {
		EventLaunched: conflict, EventBooted: failed, EventCrashed: becomes(StatusCrashed),
		EventBlocked: failed, EventUnblocked: failed, EventPaused: failed, EventResumed: failed,
		EventStopping: failed, EventStopped: becomes(StatusStopped), EventSuspended: becomes(StatusSuspended),
		EventDiscarded: becomes(StatusRemoving), EventRemoving: inUse,
	},
	StatusStopped: {
		EventLaunched: becomes(StatusStarting), EventBooted: failed, EventCrashed: failed,
		EventBlocked: failed, EventUnblocked: failed, EventPaused: failed, EventResumed: failed,
		EventStopping: failed, EventStopped: failed, EventSuspended: failed,
		EventDiscarded: failed, EventRemoving: becomes(StatusRemoving),
	},
	StatusCrashed: {
		EventLaunched: becomes(StatusStarting), EventBooted: failed, EventCrashed: failed,
		EventBlocked: failed, EventUnblocked: failed, EventPaused: failed, EventResumed: failed,
		EventStopping: failed, EventStopped: failed, EventSuspended: failed,
		EventDiscarded: failed, EventRemoving: becomes(StatusRemoving),
	},
	StatusRemoving: {
		EventLaunched: failed, EventBooted: failed, EventCrashed: failed,
		EventBlocked: failed, EventUnblocked: failed, EventPaused: failed, EventResumed: failed,
		EventStopping: failed, EventStopped: failed, EventSuspended: failed,
		EventDiscarded: failed, EventRemoving: failed,
	},
}

// Apply returns st as event ev leaves it: its status moved as the events
// table says, every other field as it was (the caller fills in what the
// event brings: PIDs, times, an error). An event the table refuses in
// st's status returns st unchanged and an error of the table's errdefs
// class.
func Apply(st State, ev Event) (State, error) {
	r, ok := events[st.Status][ev]
	if !ok {
		return st, fmt.Errorf("sandbox is %s: unknown event %q: %w", st.Status, ev, errdefs.ErrInvalid)
	}
	if r.err != nil {
		return st, fmt.Errorf("sandbox is %s: it cannot become %s: %w", st.Status, ev, r.err)
	}
	st.Status = r.t.To
	return st, nil
}

// Change applies ev to st (Apply), lets fill (when not nil) set the
// fields the event brings, and writes the result to p's state.json. It
// returns the new state even when it could not be written (the change
// happened: a supervisor's memory keeps it), with the write's error; a
// refused event returns st unchanged with the refusal. fill cannot move
// the status: only the table does.
func Change(p Paths, st State, ev Event, fill func(*State)) (State, error) {
	next, err := Apply(st, ev)
	if err != nil {
		return st, err
	}
	if fill != nil {
		to := next.Status
		fill(&next)
		next.Status = to
	}
	return next, WriteState(p, next)
}

// Update lets fill change fields of st other than its status (a PID, a
// time, why it stopped) and writes the result, as Change does.
func Update(p Paths, st State, fill func(*State)) (State, error) {
	next := st
	fill(&next)
	next.Status = st.Status
	return next, WriteState(p, next)
}

// Next is the events table without a sandbox: the status ev leaves a
// sandbox in status st in, or the class of error that refuses it.
func Next(st Status, ev Event) (Status, error) {
	r, ok := events[st][ev]
	if !ok {
		return "", errdefs.ErrInvalid
	}
	return r.t.To, r.err
}

// Check says what op does to sandbox in, or returns the error that
// refuses it: one sentence that says what to do instead, wrapping the
// table's errdefs class.
func Check(in *Info, op Op) (Transition, error) {
	st := in.State.Status
	r, ok := table[st][op]
	if !ok {
		return Transition{}, fmt.Errorf("sandbox %s is %s: unknown operation %q: %w", in.Spec.Name, st, op, errdefs.ErrInvalid)
	}
	if r.err == nil {
		return r.t, nil
	}
	return Transition{}, refusal(in, op, r.err)
}

// Allowed is the table without a sandbox: the transition of op from st,
// or the class of error that refuses it.
func Allowed(st Status, op Op) (Transition, error) {
	r, ok := table[st][op]
	if !ok {
		return Transition{}, errdefs.ErrInvalid
	}
	return r.t, r.err
}

// refusal words the error for a refused operation. The wording is the
// CLI's contract (its script tests match it).
func refusal(in *Info, op Op, class error) error {
	name, st := in.Spec.Name, in.State.Status
	msg := fmt.Sprintf("sandbox %s is %s", name, st)
	if st == StatusRemoving {
		return fmt.Errorf("%s: finish with `smx agent rm -f %s`: %w", msg, name, class)
	}
	switch op {
	case OpStart:
		return fmt.Errorf("sandbox %s is already %s: %w", name, st, class)
	case OpRemove:
		return fmt.Errorf("%s: stop it first or use `smx agent rm -f %s`: %w", msg, name, class)
	case OpExec:
		if st == StatusBlocked {
			return fmt.Errorf("%s: %s: %w", msg, in.State.Error, class)
		}
		if st == StatusCrashed && in.State.Error != "" {
			msg += " (" + in.State.Error + ")"
		}
		verb := "start"
		if st == StatusPaused || st == StatusSuspended {
			verb = "resume"
		}
		return fmt.Errorf("%s: %s it with `smx agent %s %s`: %w", msg, verb, verb, name, class)
	case OpPause, OpSuspend, OpSnapshot:
		if (st == StatusCrashed || st == StatusBlocked) && in.State.Error != "" {
			msg += " (" + in.State.Error + ")"
		}
		return fmt.Errorf("%s: only a running or paused sandbox can be paused, suspended or snapshotted: %w", msg, class)
	case OpResume:
		return fmt.Errorf("%s, not paused or suspended: start it with `smx agent start %s`: %w", msg, name, class)
	case OpPolicy:
		return fmt.Errorf("%s: change its profile once it is running or stopped: %w", msg, class)
	}
	return fmt.Errorf("%s: cannot %s it: %w", msg, op, class)
}

// cell is one entry of the table as docs/architecture.md prints it:
// "A→B" (via A to B), "B" (straight to B), "=" (nothing to do),
// "removed"; a "*" when the supervisor carries it out; "✗ CLASS" when it
// is refused with that errdefs class.
func cell(st Status, op Op) string {
	r := table[st][op]
	if r.err != nil {
		return "✗ " + errdefs.Class(r.err)
	}
	t := r.t
	var s string
	switch {
	case t.NoOp:
		s = "="
	case t.To == "":
		s = "removed"
		if t.Via != "" {
			s = string(t.Via) + "→removed"
		}
	case t.Via != "":
		s = string(t.Via) + "→" + string(t.To)
	default:
		s = string(t.To)
	}
	if t.Supervisor {
		s += " *"
	}
	return s
}

// MarkdownTable renders the state table as docs/architecture.md shows it
// (a test keeps the two equal).
func MarkdownTable() string {
	return markdownTable("op", Ops, cell)
}

// EventsMarkdownTable renders the events table as MarkdownTable renders
// the operations: each cell the status the event leaves, or "✗ CLASS".
func EventsMarkdownTable() string {
	return markdownTable("event", Events, func(st Status, ev Event) string {
		to, err := Next(st, ev)
		if err != nil {
			return "✗ " + errdefs.Class(err)
		}
		return string(to)
	})
}

// markdownTable is one row per status and one column per col, each cell
// as cell words it.
func markdownTable[C ~string](corner string, cols []C, cell func(Status, C) string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| status \\ %s |", corner)
	for _, c := range cols {
		fmt.Fprintf(&b, " %s |", c)
	}
	b.WriteString("\n|---|")
	for range cols {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, st := range Statuses {
		fmt.Fprintf(&b, "| %s |", st)
		for _, c := range cols {
			fmt.Fprintf(&b, " %s |", cell(st, c))
		}
		b.WriteString("\n")
	}
	return b.String()
}
