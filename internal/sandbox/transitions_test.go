package sandbox

import (
	"errors"
	"os"
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
}
