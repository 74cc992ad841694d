package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/statedir"
)

// A supervisor killed with SIGKILL writes nothing; the first CLI that looks
// (here: many at once) records the crash in the sandbox's log, once.
func TestDeadSupervisorRecordedOnce(t *testing.T) {
	m, p := newDevSandbox(t)
	// A real process that held the lock and died.
	cmd := exec.Command("flock", p.Lock(), "true")
	if err := cmd.Run(); err != nil {
		t.Skipf("flock(1): %v", err)
	}
	if err := WriteState(p, State{Status: StatusRunning, SupervisorPID: cmd.Process.Pid, QEMUPID: 1 << 22}); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in, err := m.Get("dev")
			if err != nil || in.State.Status != StatusCrashed {
				t.Errorf("Get: %+v, %v", in, err)
			}
		}()
	}
	wg.Wait()
	if _, err := m.List(); err != nil {
		t.Fatal(err)
	}
	recs, err := audit.Read(audit.Dir(m.State.Logs(), "dev"), audit.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	crashes := 0
	for _, r := range recs {
		if r.Kind == audit.KindSandboxCrash {
			crashes++
			if r.Fields["phase"] != "supervisor" {
				t.Errorf("crash record: %+v", r.Fields)
			}
		}
	}
	if crashes != 1 {
		t.Fatalf("%d sandbox.crash records, want 1: %+v", crashes, recs)
	}
	st, err := readState(p)
	if err != nil || st.Status != StatusCrashed || st.Error != "supervisor died" {
		t.Fatalf("state.json after the crash was recorded: %+v, %v", st, err)
	}
	key, err := audit.LoadOrCreateKey(m.State.Audit())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := audit.Verify(audit.Dir(m.State.Logs(), "dev"), key.Verifier())
	if err != nil || !rep.OK() || !rep.Closed {
		t.Fatalf("verify: %v\n%s", err, rep)
	}
	if _, err := os.Stat(p.Lock()); err != nil {
		t.Fatal(err)
	}
}

// A supervisor that ends between Get's read of its state and the check of
// its lock wrote its last state before letting the lock go: Get reports
// that state, not a crash, and nothing is recorded.
func TestSupervisorEndedDuringGet(t *testing.T) {
	m, p := newDevSandbox(t)
	lock, err := statedir.LockFile(p.Lock())
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteState(p, State{Status: StatusRunning, SupervisorPID: os.Getpid()}); err != nil {
		t.Fatal(err)
	}
	afterStateRead = func() {
		afterStateRead = nil
		if err := WriteState(p, State{Status: StatusStopped}); err != nil {
			t.Error(err)
		}
		lock.Unlock()
	}
	t.Cleanup(func() { afterStateRead = nil })
	in, err := m.Get("dev")
	if err != nil || in.State.Status != StatusStopped {
		t.Fatalf("Get: %+v, %v; want stopped", in, err)
	}
	if recs, _ := audit.Read(audit.Dir(m.State.Logs(), "dev"), audit.Filter{}); len(recs) != 0 {
		t.Fatalf("records: %+v, want none", recs)
	}
}

// newDevSandbox makes sandbox "dev" in a state directory of its own, with
// the log key pinned to the test.
func newDevSandbox(t *testing.T) (*Manager, Paths) {
	t.Helper()
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	m := &Manager{State: statedir.Dir{Root: t.TempDir()}}
	if err := m.State.Ensure(); err != nil {
		t.Fatal(err)
	}
	p, err := m.Create(Spec{Name: "dev", Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	return m, p
}

// A sandbox whose directory is renamed away (its supervisor removing it)
// between Get's reads is not found: it never reads as created for want of
// the state it no longer has (a CI run's `smx agent ls` right after
// `smx run` listed a removed sandbox as created so).
func TestSandboxRemovedDuringGet(t *testing.T) {
	m, p := newDevSandbox(t)
	if err := os.Remove(p.State()); err != nil {
		t.Fatal(err)
	}
	afterStateRead = func() {
		afterStateRead = nil
		if err := os.Rename(p.Dir, filepath.Join(m.State.Sandboxes(), ".rm-dev")); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { afterStateRead = nil })
	if in, err := m.Get("dev"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get: %+v, %v; want not found", in, err)
	}
	if l, err := m.List(); err != nil || len(l) != 0 {
		t.Fatalf("List: %+v, %v; want none", l, err)
	}
}
