package shim

import (
	"context"
	"testing"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	tasktypes "github.com/containerd/containerd/api/types/task"

	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/statedir"
)

// A task's status is its sandbox's while its process runs: a sandbox
// paused (`smx agent pause`), blocked on a full disk or suspended shows
// as a paused task, one that ended before the exit came back as unknown;
// before Start and after the exit, the process's own (created, stopped
// with its exit status). The sandbox is a real one on disk, in each
// status as its writer left it.
func TestTaskStatusFollowsSandbox(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	st := statedir.Dir{Root: t.TempDir()}
	if err := st.Ensure(); err != nil {
		t.Fatal(err)
	}
	m := &sandbox.Manager{State: st}
	p, err := m.Create(sandbox.Spec{Name: "box", Image: "busybox", CPUs: 1, MemoryMiB: 256, Created: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	init := newProc("t1", "", nil, "", "", "", false)
	s := &Shim{svc: service.New(st, nil), vm: &podVM{name: "box"}, tasks: map[string]*task{"t1": {id: "t1", init: init}}}
	state := func() *taskapi.StateResponse {
		t.Helper()
		r, err := s.State(context.Background(), &taskapi.StateRequest{ID: "t1"})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if got := state().Status; got != tasktypes.Status_CREATED {
		t.Errorf("before Start: %s, want CREATED", got)
	}
	init.started = true
	want := map[sandbox.Status]tasktypes.Status{
		sandbox.StatusRunning:   tasktypes.Status_RUNNING,
		sandbox.StatusStopping:  tasktypes.Status_RUNNING,
		sandbox.StatusPaused:    tasktypes.Status_PAUSED,
		sandbox.StatusBlocked:   tasktypes.Status_PAUSED,
		sandbox.StatusSuspended: tasktypes.Status_PAUSED,
		sandbox.StatusStopped:   tasktypes.Status_UNKNOWN,
		sandbox.StatusCrashed:   tasktypes.Status_UNKNOWN,
	}
	for sb, w := range want {
		// Not live on disk without a supervisor (it would read crashed):
		// the live ones are what a supervisor holding the lock wrote.
		if sb.Live() {
			l, err := statedir.LockFile(p.Lock())
			if err != nil {
				t.Fatal(err)
			}
			sandbox.WriteState(p, sandbox.State{Status: sb})
			got := state().Status
			l.Unlock()
			if got != w {
				t.Errorf("sandbox %s: task %s, want %s", sb, got, w)
			}
			continue
		}
		sandbox.WriteState(p, sandbox.State{Status: sb})
		if got := state().Status; got != w {
			t.Errorf("sandbox %s: task %s, want %s", sb, got, w)
		}
	}
	// The exit came back: stopped with its status, whatever the sandbox.
	sandbox.WriteState(p, sandbox.State{Status: sandbox.StatusStopped})
	init.code = 3
	close(init.exited)
	if r := state(); r.Status != tasktypes.Status_STOPPED || r.ExitStatus != 3 {
		t.Errorf("after the exit: %s, code %d; want STOPPED, 3", r.Status, r.ExitStatus)
	}
	// The sandbox gone (the VM's task deleted): a running process is unknown.
	s.vm = nil
	running := newProc("t1", "e1", nil, "", "", "", false)
	running.started = true
	s.tasks["t1"].execs = map[string]*proc{"e1": running}
	if r, err := s.State(context.Background(), &taskapi.StateRequest{ID: "t1", ExecID: "e1"}); err != nil || r.Status != tasktypes.Status_UNKNOWN {
		t.Errorf("no sandbox: %v, %v", r, err)
	}
}
