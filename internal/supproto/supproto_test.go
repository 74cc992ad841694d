package supproto

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
)

// Only exec, copy-in, copy-out and health reach the guest; every other
// guest op, and anything unknown, is refused as invalid.
func TestToGuestAllowList(t *testing.T) {
	relayed := map[string]bool{OpExec: true, OpCopyIn: true, OpCopyOut: true, OpHealth: true}
	guestOps := []string{
		agentproto.OpExec, agentproto.OpCopyIn, agentproto.OpCopyOut, agentproto.OpHealth,
		agentproto.OpSetTime, agentproto.OpAddEntropy, agentproto.OpPowerOff, agentproto.OpSetHostname,
		agentproto.OpInstallCA, agentproto.OpInstallSSHCA, agentproto.OpMountData, agentproto.OpMount, agentproto.OpUnmount,
		OpStop, OpPause, OpResume, OpSuspend, OpSnapshot, OpSetProfile, OpDiscard, OpCopyRefused, OpPortAdd, OpPortRemove, OpPortList, OpMountAdd, OpMountRemove, "", "EXEC", "exec ",
	}
	for _, op := range guestOps {
		r := &Request{Op: op, Exec: &ExecRequest{Args: []string{"true"}}, Path: "/tmp"}
		g, err := ToGuest(r)
		if relayed[op] {
			if err != nil || g.Op != op {
				t.Errorf("ToGuest(%q) = %+v, %v; want relayed", op, g, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ToGuest(%q) = %+v, %v; want refused as invalid", op, g, err)
		}
		if Relayed(op) {
			t.Errorf("Relayed(%q) = true", op)
		}
	}
	if _, err := ToGuest(&Request{Op: OpExec}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("an exec without a command: %v", err)
	}
}

// An exec is rebuilt field by field: what a client sends beyond
// ExecRequest's fields never reaches the guest.
func TestToGuestRebuildsExec(t *testing.T) {
	r, err := ReadRequest(bytes.NewReader(frame(t, `{"op":"exec","exec":{"args":["id"],"user":"1000"},"entropy":"AAAA","ca_cert":"eA==","mount":{"tag":"x"}}`)))
	if err != nil {
		t.Fatal(err)
	}
	g, err := ToGuest(r)
	if err != nil {
		t.Fatal(err)
	}
	if g.Entropy != nil || g.CACert != nil || g.Mount != nil || g.Exec.User != "1000" || g.Exec.Args[0] != "id" {
		t.Fatalf("guest request %+v carries more than the exec", g)
	}
}

// An error's class survives the socket.
func TestErrorClassAcrossTheWire(t *testing.T) {
	for _, class := range []error{errdefs.ErrNotFound, errdefs.ErrInvalid, errdefs.ErrExists, errdefs.ErrFailed, errdefs.ErrUnavailable, errdefs.ErrDenied, errdefs.ErrInUse} {
		var buf bytes.Buffer
		WriteError(&buf, fmt.Errorf("sandbox x: %w", class))
		_, err := ReadResult(&buf)
		if !errors.Is(err, class) || err.Error() != "sandbox x: "+class.Error() {
			t.Errorf("%v came back as %v", class, err)
		}
	}
	var buf bytes.Buffer
	WriteError(&buf, errors.New("plain"))
	if _, err := ReadResult(&buf); err == nil || errdefs.Class(err) != "" {
		t.Errorf("an unclassed error came back as %v", err)
	}
}

func frame(t *testing.T, js string) []byte {
	var buf bytes.Buffer
	if err := agentproto.WriteFrame(&buf, agentproto.FrameRequest, []byte(js)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
