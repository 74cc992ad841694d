package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
)

// ops runs each operation of the state table through the service.
var ops = map[sandbox.Op]func(ctx context.Context, s *Service, name string) error{
	sandbox.OpStart: func(ctx context.Context, s *Service, name string) error {
		_, err := s.Start(ctx, StartRequest{Name: name})
		return err
	},
	sandbox.OpStop: func(ctx context.Context, s *Service, name string) error {
		_, err := s.Stop(ctx, StopRequest{Name: name, Timeout: 5 * time.Second})
		return err
	},
	sandbox.OpRemove: func(ctx context.Context, s *Service, name string) error {
		return s.Remove(ctx, RemoveRequest{Name: name})
	},
	sandbox.OpForceRemove: func(ctx context.Context, s *Service, name string) error {
		return s.Remove(ctx, RemoveRequest{Name: name, Force: true})
	},
	sandbox.OpExec: func(ctx context.Context, s *Service, name string) error {
		_, err := s.Exec(ctx, ExecRequest{Name: name, Args: []string{"true"}}, ExecIO{})
		return err
	},
	sandbox.OpPause: func(ctx context.Context, s *Service, name string) error {
		_, err := s.Pause(ctx, name)
		return err
	},
	sandbox.OpResume: func(ctx context.Context, s *Service, name string) error {
		_, err := s.Resume(ctx, name)
		return err
	},
	sandbox.OpSuspend: func(ctx context.Context, s *Service, name string) error {
		_, err := s.Suspend(ctx, name, nil)
		return err
	},
	sandbox.OpSnapshot: func(ctx context.Context, s *Service, name string) error {
		_, err := s.CreateSnapshot(ctx, SnapshotRequest{Sandbox: name, Name: name + "-snap"})
		return err
	},
	sandbox.OpPolicy: func(ctx context.Context, s *Service, name string) error {
		_, err := s.SetPolicy(ctx, PolicyRequest{Name: name, Profile: "locked"})
		return err
	},
	sandbox.OpPort: func(ctx context.Context, s *Service, name string) error {
		_, err := s.AddPort(ctx, PortRequest{Name: name, Port: "0:80"})
		return err
	},
}

func newTestService(t *testing.T) *Service {
	t.Helper()
	t.Setenv("XDG_CONFIG_HOME", t.TempDir()) // the log key's pin stays with the test
	st := statedir.Dir{Root: t.TempDir()}
	if err := st.Ensure(); err != nil {
		t.Fatal(err)
	}
	return New(st, nil)
}

// record makes sandbox name with status st on disk, as its last writer
// left it. For a live status it holds the supervisor lock, as a live
// supervisor does, until the test ends (it has no socket: operations a
// supervisor carries out are run against real ones in TestStateTableVM).
func record(t *testing.T, s *Service, name string, st sandbox.Status) {
	t.Helper()
	m := s.manager()
	p, err := m.Create(sandbox.Spec{Name: name, Image: "busybox", CPUs: 1, MemoryMiB: 256, Profile: "dev", Created: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.Profile(), []byte("name: dev\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if st == sandbox.StatusSuspended {
		// What a suspend leaves: the saved state and what it needs.
		os.WriteFile(p.SuspendState(), []byte("state"), 0o600)
		os.WriteFile(p.SuspendHost(), []byte("{}"), 0o600)
	}
	if err := sandbox.WriteState(p, sandbox.State{Status: st, Error: "test"}); err != nil {
		t.Fatal(err)
	}
	if st.Live() {
		l, err := statedir.LockFile(p.Lock())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Unlock() })
	}
}

// TestStateTable runs every (status, operation) pair that needs no
// running VM through the service: a refused pair fails with the table's
// error class and leaves the sandbox as it was; an allowed one leaves it
// in the table's status (or removed). The pairs that boot a guest or that
// a supervisor carries out are TestStateTableVM's.
func TestStateTable(t *testing.T) {
	s := newTestService(t)
	ctx := context.Background()
	ran := 0
	for _, st := range sandbox.Statuses {
		for _, op := range sandbox.Ops {
			tr, class := sandbox.Allowed(st, op)
			if class == nil && (tr.Supervisor || tr.To == sandbox.StatusRunning) {
				continue // needs a supervisor or a boot
			}
			ran++
			name := fmt.Sprintf("t%d", ran)
			t.Run(fmt.Sprintf("%s/%s", st, op), func(t *testing.T) {
				record(t, s, name, st)
				err := ops[op](ctx, s, name)
				in, gerr := s.manager().Get(name)
				if class != nil {
					if !errors.Is(err, class) {
						t.Fatalf("%s on a %s sandbox: %v, want class %s", op, st, err, errdefs.Class(class))
					}
					if gerr != nil || in.State.Status != st {
						t.Fatalf("a refused %s changed the sandbox: %v %+v", op, gerr, in)
					}
					return
				}
				if err != nil {
					t.Fatalf("%s on a %s sandbox: %v", op, st, err)
				}
				if tr.To == "" {
					if !errors.Is(gerr, errdefs.ErrNotFound) {
						t.Fatalf("after %s: Get = %v, want not found", op, gerr)
					}
					return
				}
				if gerr != nil || in.State.Status != tr.To {
					t.Fatalf("after %s: %+v %v, want status %s", op, in, gerr, tr.To)
				}
			})
		}
	}
	if ran < 60 {
		t.Fatalf("only %d pairs ran without a VM", ran)
	}
}

// A profile change on a sandbox without a supervisor is written for the
// next start and logged by the service; one on a sandbox whose supervisor
// is starting is refused and changes nothing.
func TestSetPolicyWithoutSupervisor(t *testing.T) {
	s := newTestService(t)
	ctx := context.Background()
	record(t, s, "off", sandbox.StatusStopped)
	r, err := s.SetPolicy(ctx, PolicyRequest{Name: "off", Profile: "locked"})
	if err != nil || r.Applied {
		t.Fatalf("SetPolicy = %+v, %v; want set for the next start", r, err)
	}
	in, _ := s.manager().Get("off")
	if in.Spec.Profile != "locked" || in.Spec.ProfileHash != r.Hash {
		t.Fatalf("spec after SetPolicy: %+v", in.Spec)
	}
	recs, err := audit.Read(audit.Dir(s.state.Logs(), "off"), audit.Filter{})
	changed := false
	for _, r := range recs {
		changed = changed || r.Kind == audit.KindProfileChange && r.Fields["profile"] == "locked"
	}
	if err != nil || !changed {
		t.Fatalf("no profile.change in the log after SetPolicy: %v %+v", err, recs)
	}

	record(t, s, "booting", sandbox.StatusStarting)
	before, _ := os.ReadFile(filepath.Join(s.manager().Paths("booting").Profile()))
	if _, err := s.SetPolicy(ctx, PolicyRequest{Name: "booting", Profile: "locked"}); !errors.Is(err, errdefs.ErrFailed) {
		t.Fatalf("SetPolicy while starting: %v, want failed precondition", err)
	}
	after, _ := os.ReadFile(filepath.Join(s.manager().Paths("booting").Profile()))
	if string(before) != string(after) {
		t.Fatal("a refused profile change rewrote profile.yaml")
	}
}

// The wait for a supervisor to exit (after suspend or snapshot --stop)
// ends with the caller's context; it used to poll for ever.
func TestWaitGoneHonoursContext(t *testing.T) {
	s := newTestService(t)
	record(t, s, "stuck", sandbox.StatusStopping) // its "supervisor" never lets go
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.waitGone(ctx, "stuck") }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("waitGone after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("waitGone ignored its context")
	}
}

// A `smx run` whose CLI has exited leaves its sandbox to its supervisor,
// which removes it after the fact (supproto.OpDiscard): while that
// supervisor lives, ls does not show the sandbox and an rm, a create of
// the same name or a log read waits for the removal to finish. A
// removal cut short (the supervisor died) is listed as removing and
// finished by rm -f.
func TestDiscardingSandbox(t *testing.T) {
	s := newTestService(t)
	ctx := context.Background()
	record(t, s, "going", sandbox.StatusRemoving)
	p := s.manager().Paths("going")
	l, err := statedir.LockFile(p.Lock()) // its supervisor, still tearing down
	if err != nil {
		t.Fatal(err)
	}
	record(t, s, "cut", sandbox.StatusRemoving) // its supervisor died mid-teardown
	list, err := s.List(ctx)
	if err != nil || len(list) != 1 || list[0].Spec.Name != "cut" || list[0].State.Status != sandbox.StatusRemoving {
		t.Fatalf("List = %+v, %v; want only cut, removing", list, err)
	}
	// A reader that read the record while the supervisor lived and checks
	// its lock after the supervisor renamed the directory away and exited
	// (a CI run's ls listed a finished `smx run` as removing): removed,
	// not cut short.
	record(t, s, "done", sandbox.StatusRemoving)
	done, err := s.manager().Get("done")
	if err != nil {
		t.Fatal(err)
	}
	os.Rename(s.manager().Paths("done").Dir, filepath.Join(s.state.Sandboxes(), ".rm-done"))
	if !discarding(s.manager(), *done) {
		t.Fatal("a sandbox whose supervisor removed it after it was read reads as a removal cut short")
	}
	if discarding(s.manager(), list[0].Info) {
		t.Fatal("a removal cut short reads as one its supervisor carries out")
	}
	go func() {
		time.Sleep(200 * time.Millisecond)
		os.Rename(p.Dir, filepath.Join(s.state.Sandboxes(), ".rm-going"))
		l.Unlock()
	}()
	if err := s.Remove(ctx, RemoveRequest{Name: "going"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("rm while its supervisor removes it: %v, want not found once it is gone", err)
	}
	if err := s.Remove(ctx, RemoveRequest{Name: "cut"}); err != nil {
		t.Fatalf("rm of a removal cut short: %v", err)
	}
	if list, err := s.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("List after rm = %+v, %v", list, err)
	}
}
