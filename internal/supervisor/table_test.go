package supervisor

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/supproto"
)

// Every request of the protocol has its entry in served: an operation of
// the state table, or "" for one that changes nothing.
func TestServedCoversProtocol(t *testing.T) {
	for _, op := range supproto.Ops {
		if _, ok := served[op]; !ok {
			t.Errorf("supproto op %q is not in served: decide which state-table operation it is", op)
		}
	}
	if len(served) != len(supproto.Ops) {
		t.Errorf("served has %d ops, supproto lists %d", len(served), len(supproto.Ops))
	}
	for op, tableOp := range served {
		if tableOp != "" && !containsOp(tableOp) {
			t.Errorf("%s is checked as %q, which the table does not have", op, tableOp)
		}
	}
}

func containsOp(op sandbox.Op) bool {
	for _, o := range sandbox.Ops {
		if o == op {
			return true
		}
	}
	return false
}

// The supervisor refuses, in the table's words and class, every request
// the table refuses in the status it holds, before it acts on it or
// relays it to the guest (there is none here: a request that got past
// the check would fail for want of a session, with another class).
func TestHandleChecksTable(t *testing.T) {
	checked := 0
	for _, st := range sandbox.Statuses {
		if !st.Live() {
			continue // no supervisor serves these
		}
		for _, op := range supproto.Ops {
			_, class := sandbox.Allowed(st, served[op])
			if served[op] == "" || class == nil {
				continue
			}
			checked++
			s := &Supervisor{
				spec:  sandbox.Spec{Name: "box"},
				state: sandbox.State{Status: st, Error: "host disk full"},
			}
			cli, srv := net.Pipe()
			done := make(chan struct{})
			go func() { defer close(done); s.handle(srv) }()
			req := &supproto.Request{Op: op, Path: "/", Snapshot: "snap", Exec: &supproto.ExecRequest{Args: []string{"true"}},
				Port: &publish.Port{HostPort: 8080, GuestPort: 80}}
			if err := supproto.WriteRequest(cli, req); err != nil {
				t.Fatal(err)
			}
			_, err := supproto.ReadResult(cli)
			cli.Close()
			<-done
			where := op + " on " + string(st)
			if !errors.Is(err, class) {
				t.Errorf("%s: %v, want refused with %v", where, err, class)
				continue
			}
			if !strings.Contains(err.Error(), "sandbox box is "+string(st)) {
				t.Errorf("%s: %q does not say the sandbox and its status", where, err)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d refused pairs checked", checked)
	}
	// The words a client sees for the commonest one.
	s := &Supervisor{spec: sandbox.Spec{Name: "box"}, state: sandbox.State{Status: sandbox.StatusPaused}}
	if _, err := s.check(served[supproto.OpExec]); err == nil || !strings.Contains(err.Error(), "sandbox box is paused: resume it with `smx agent resume box`") {
		t.Errorf("exec on a paused sandbox: %v", err)
	}
}

// Unknown requests are refused before anything else.
func TestHandleUnknownOp(t *testing.T) {
	s := &Supervisor{spec: sandbox.Spec{Name: "box"}, state: sandbox.State{Status: sandbox.StatusRunning}}
	cli, srv := net.Pipe()
	go s.handle(srv)
	supproto.WriteRequest(cli, &supproto.Request{Op: "power-off"})
	if _, err := supproto.ReadResult(cli); err == nil || !strings.Contains(err.Error(), "unknown op") {
		t.Errorf("unknown op: %v", err)
	}
	cli.Close()
}
