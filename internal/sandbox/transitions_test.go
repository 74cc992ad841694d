package sandbox

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Every (status, operation) pair has a rule.
func TestTableComplete(t *testing.T) {
	for _, st := range Statuses {
		for _, op := range Ops {
			if _, ok := table[st][op]; !ok {
				t.Errorf("no rule for %s on a %s sandbox", op, st)
			}
		}
	}
	if len(table) != len(Statuses) {
		t.Errorf("table has %d statuses, Statuses lists %d", len(table), len(Statuses))
	}
}

// The rules obey what the rest of smx relies on.
func TestTableInvariants(t *testing.T) {
	allowed := []error{errdefs.ErrFailed, errdefs.ErrExists, errdefs.ErrInUse}
	for _, st := range Statuses {
		for _, op := range Ops {
			tr, err := Allowed(st, op)
			where := string(op) + " on " + string(st)
			if err != nil {
				if !slices.Contains(allowed, err) {
					t.Errorf("%s: refused with %v, not one of the table's classes", where, err)
				}
				continue
			}
			// Only a supervisor can act on a live sandbox, and a sandbox
			// without one needs no supervisor to be acted on.
			if tr.Supervisor != st.Live() {
				t.Errorf("%s: Supervisor = %v but status live = %v", where, tr.Supervisor, st.Live())
			}
			if tr.To != "" && !slices.Contains(Statuses, tr.To) || tr.Via != "" && !slices.Contains(Statuses, tr.Via) {
				t.Errorf("%s: unknown status in %+v", where, tr)
			}
			if tr.NoOp && tr.To != st {
				t.Errorf("%s: a no-op must leave the status as it is, not %s", where, tr.To)
			}
			removes := op == OpRemove || op == OpForceRemove
			if removes != (tr.To == "") {
				t.Errorf("%s: only rm ends a sandbox (To = %q)", where, tr.To)
			}
		}
	}
	// The guest agent is reachable only while the sandbox runs.
	for _, st := range Statuses {
		if _, err := Allowed(st, OpExec); (err == nil) != (st == StatusRunning) {
			t.Errorf("exec on %s: allowed = %v", st, err == nil)
		}
	}
	// A live sandbox is never removed without -f.
	for _, st := range Statuses {
		if _, err := Allowed(st, OpRemove); st.Live() && !errors.Is(err, errdefs.ErrInUse) {
			t.Errorf("rm on %s: %v, want in use", st, err)
		}
	}
}

// Check's refusals name the sandbox, say what to do, and keep the class.
func TestCheckRefusals(t *testing.T) {
	for _, st := range Statuses {
		for _, op := range Ops {
			in := &Info{Spec: Spec{Name: "box"}, State: State{Status: st, Error: "disk full"}}
			_, class := Allowed(st, op)
			_, err := Check(in, op)
			if (err == nil) != (class == nil) {
				t.Fatalf("%s on %s: Check = %v, table class %v", op, st, err, class)
			}
			if err == nil {
				continue
			}
			if !errors.Is(err, class) {
				t.Errorf("%s on %s: %v is not %v", op, st, err, class)
			}
			if !strings.Contains(err.Error(), "sandbox box is ") && !strings.Contains(err.Error(), "sandbox box is already") {
				t.Errorf("%s on %s: %q does not name the sandbox and its status", op, st, err)
			}
		}
	}
	in := &Info{Spec: Spec{Name: "box"}, State: State{Status: StatusPaused}}
	if _, err := Check(in, OpExec); err == nil || !strings.Contains(err.Error(), "resume it with `smx agent resume box`") {
		t.Errorf("exec on a paused sandbox: %v, want a hint to resume", err)
	}
}

// docs/architecture.md shows the table; it must be this table.
func TestTableDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- state-table begin -->\n", "<!-- state-table end -->"
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("docs/architecture.md has no %q ... %q section", strings.TrimSpace(begin), end)
	}
	if got, want := doc[i+len(begin):j], MarkdownTable(); got != want {
		t.Errorf("docs/architecture.md's state table differs from the code's; replace it with:\n%s", want)
	}
	const ebegin, eend = "<!-- events-table begin -->\n", "<!-- events-table end -->"
	i, j = strings.Index(doc, ebegin), strings.Index(doc, eend)
	if i < 0 || j < i {
		t.Fatalf("docs/architecture.md has no %q ... %q section", strings.TrimSpace(ebegin), eend)
	}
	if got, want := doc[i+len(ebegin):j], EventsMarkdownTable(); got != want {
		t.Errorf("docs/architecture.md's events table differs from the code's; replace it with:\n%s", want)
	}
}

// Every (status, event) pair has a rule.
func TestEventsComplete(t *testing.T) {
	for _, st := range Statuses {
		for _, ev := range Events {
			if _, ok := events[st][ev]; !ok {
				t.Errorf("no rule for %s on a %s sandbox", ev, st)
			}
		}
	}
	if len(events) != len(Statuses) {
		t.Errorf("events has %d statuses, Statuses lists %d", len(events), len(Statuses))
	}
}

// The events table, pair by pair: the allowed pairs and where each
// leaves the sandbox are written out here apart from the table; every
// other pair is refused, with the class that says why.
func TestEventTable(t *testing.T) {
	live := []Status{StatusStarting, StatusRunning, StatusPaused, StatusBlocked, StatusStopping}
	idle := []Status{StatusCreated, StatusStopped, StatusCrashed, StatusSuspended}
	want := map[Status]map[Event]Status{}
	allow := func(ev Event, to Status, from ...Status) {
		for _, st := range from {
			if want[st] == nil {
				want[st] = map[Event]Status{}
			}
			want[st][ev] = to
		}
	}
	allow(EventLaunched, StatusStarting, idle...)
	allow(EventBooted, StatusRunning, StatusStarting)
	allow(EventCrashed, StatusCrashed, live...)
	allow(EventBlocked, StatusBlocked, StatusRunning, StatusPaused)
	allow(EventUnblocked, StatusRunning, StatusBlocked)
	allow(EventPaused, StatusPaused, StatusRunning)
	allow(EventResumed, StatusRunning, StatusPaused)
	allow(EventStopping, StatusStopping, StatusStarting, StatusRunning, StatusPaused, StatusBlocked)
	allow(EventStopped, StatusStopped, StatusStopping, StatusSuspended)
	allow(EventSuspended, StatusSuspended, StatusStopping)
	allow(EventDiscarded, StatusRemoving, live...)
	allow(EventRemoving, StatusRemoving, idle...)

	for _, st := range Statuses {
		for _, ev := range Events {
			where := string(ev) + " on " + string(st)
			to, err := Next(st, ev)
			if wantTo, ok := want[st][ev]; ok {
				if err != nil || to != wantTo {
					t.Errorf("%s: %q, %v; want %s", where, to, err, wantTo)
				}
				continue
			}
			class := errdefs.ErrFailed
			switch {
			case ev == EventLaunched && st.Live():
				class = errdefs.ErrExists // already running
			case ev == EventRemoving && st.Live():
				class = errdefs.ErrInUse // a supervisor holds it
			}
			if err != class {
				t.Errorf("%s: %q, %v; want refused with %v", where, to, err, class)
			}
		}
	}
}

// Every step of every operation the operations table allows is an event
// the events table allows: an operation moves a sandbox only as events
// can.
func TestEventsCarryOperations(t *testing.T) {
	reach := func(from, to Status) bool {
		for _, ev := range Events {
			if got, err := Next(from, ev); err == nil && got == to {
				return true
			}
		}
		return false
	}
	for _, st := range Statuses {
		for _, op := range Ops {
			tr, err := Allowed(st, op)
			if err != nil || tr.NoOp {
				continue
			}
			at := st
			if tr.Via != "" && tr.Via != st {
				if !reach(st, tr.Via) {
					t.Errorf("%s on %s: no event goes from %s to %s", op, st, st, tr.Via)
				}
				at = tr.Via
			}
			if tr.To != "" && tr.To != at && !reach(at, tr.To) {
				t.Errorf("%s on %s: no event goes from %s to %s", op, st, at, tr.To)
			}
		}
	}
}

// Apply moves the status and nothing else; a refused event changes
// nothing. Change writes what Apply gives, and neither it nor Update
// lets the caller move the status.
func TestApplyChangeUpdate(t *testing.T) {
	st := State{Status: StatusRunning, SupervisorPID: 7, QEMUPID: 8, Error: "x"}
	got, err := Apply(st, EventPaused)
	if err != nil || got.Status != StatusPaused || got.SupervisorPID != 7 || got.QEMUPID != 8 || got.Error != "x" {
		t.Errorf("Apply(running, paused) = %+v, %v", got, err)
	}
	got, err = Apply(st, EventBooted)
	if !errors.Is(err, errdefs.ErrFailed) || !reflect.DeepEqual(got, st) {
		t.Errorf("Apply(running, booted) = %+v, %v; want it unchanged and refused", got, err)
	}
	if err == nil || !strings.Contains(err.Error(), "sandbox is running") {
		t.Errorf("refusal %q does not say the status", err)
	}
	if _, err := Apply(st, Event("nap")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unknown event: %v", err)
	}

	p := Paths{Dir: t.TempDir()}
	got, err = Change(p, st, EventStopping, func(s *State) {
		s.Status = StatusStopped // overruled: only the table moves it
		s.QEMUPID = 0
	})
	if err != nil || got.Status != StatusStopping || got.QEMUPID != 0 {
		t.Fatalf("Change = %+v, %v", got, err)
	}
	if disk, err := readState(p); err != nil || !reflect.DeepEqual(disk, got) {
		t.Errorf("state.json = %+v, %v; want %+v", disk, err, got)
	}
	if _, err := Change(p, got, EventBooted, nil); !errors.Is(err, errdefs.ErrFailed) {
		t.Errorf("Change(stopping, booted): %v", err)
	}
	if disk, _ := readState(p); disk.Status != StatusStopping {
		t.Errorf("a refused change was written: %+v", disk)
	}
	got, err = Update(p, got, func(s *State) { s.Status, s.StopReason = StatusRunning, "why" })
	if err != nil || got.Status != StatusStopping || got.StopReason != "why" {
		t.Errorf("Update = %+v, %v", got, err)
	}
	// A state that cannot be written is an error, and the change still
	// happened in what Change returns.
	bad := Paths{Dir: filepath.Join(t.TempDir(), "gone")}
	got, err = Change(bad, State{Status: StatusStopping}, EventStopped, nil)
	if err == nil || got.Status != StatusStopped {
		t.Errorf("Change into a missing directory = %+v, %v; want stopped and an error", got, err)
	}
}

// A supervisor taking a sandbox reads a live status left by a dead one
// as crashed, so that it can launch it.
func TestLockedState(t *testing.T) {
	p := Paths{Dir: t.TempDir()}
	if st, err := LockedState(p); err != nil || st.Status != StatusCreated {
		t.Errorf("no state.json: %+v, %v", st, err)
	}
	WriteState(p, State{Status: StatusPaused, SupervisorPID: 9})
	st, err := LockedState(p)
	if err != nil || st.Status != StatusCrashed || st.SupervisorPID != 9 {
		t.Errorf("left paused: %+v, %v", st, err)
	}
	if _, err := Apply(st, EventLaunched); err != nil {
		t.Errorf("launch after a dead supervisor: %v", err)
	}
}

// Nobody but this package writes a sandbox's state or sets its status:
// every change goes through the table (Change, Update).
func TestOneStateWriter(t *testing.T) {
	bad := regexp.MustCompile(`sandbox\.WriteState\(|\.Status(, *[A-Za-z_.]+)? *= *sandbox\.Status`)
	var files []string
	for _, root := range []string{"../../internal", "../../cmd"} {
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && path == "../../internal/sandbox" {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
				files = append(files, path)
			}
			return nil
		})
	}
	if len(files) < 50 {
		t.Fatalf("found only %d source files", len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if bad.MatchString(line) {
				t.Errorf("%s:%d writes a sandbox's state past the table: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// The events table renders with a row per status and a cell per event,
// each the table's outcome.
func TestEventsMarkdownTable(t *testing.T) {
	lines := strings.Split(strings.TrimSpace(EventsMarkdownTable()), "\n")
	if len(lines) != 2+len(Statuses) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), 2+len(Statuses), strings.Join(lines, "\n"))
	}
	for i, st := range Statuses {
		cells := strings.Split(strings.Trim(lines[2+i], "| "), " | ")
		if len(cells) != 1+len(Events) || cells[0] != string(st) {
			t.Fatalf("row %q", lines[2+i])
		}
		for j, ev := range Events {
			to, err := Next(st, ev)
			want := string(to)
			if err != nil {
				want = "✗ " + errdefs.Class(err)
			}
			if cells[1+j] != want {
				t.Errorf("%s on %s: cell %q, want %q", ev, st, cells[1+j], want)
			}
		}
	}
}
