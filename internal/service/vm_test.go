package service

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/supproto"
	"github.com/smx-dev/smx/internal/testutil"
)

// vmService is a service on a fresh state directory that can boot real
// sandboxes: the cached kernels linked in, a busybox image built, the
// supervisor run from the smx binary under test.
func vmService(t *testing.T) *Service {
	t.Helper()
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	kernels := testutil.KernelCache(t)
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	root, err := os.MkdirTemp("", "smx-svc-") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	st := statedir.Dir{Root: root}
	if err := os.Symlink(kernels, st.Kernels()); err != nil {
		t.Fatal(err)
	}
	s := New(st, nil)
	s.Supervisor = []string{filepath.Join(bin, "smx")}
	t.Cleanup(func() {
		list, _ := s.List(context.Background())
		for _, sb := range list {
			s.Remove(context.Background(), RemoveRequest{Name: sb.Spec.Name, Force: true})
		}
		os.RemoveAll(root)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := s.BuildImage(ctx, ImageBuildRequest{Name: "busybox", From: "busybox"}); err != nil {
		t.Fatal(err)
	}
	return s
}

// status reads a sandbox's status and fails the test unless it is want,
// the table's outcome of the step just run.
func wantStatus(t *testing.T, s *Service, name string, op sandbox.Op, from, want sandbox.Status) {
	t.Helper()
	in, err := s.Inspect(context.Background(), name)
	if err != nil {
		t.Fatalf("after %s: %v", op, err)
	}
	if in.State.Status != want {
		t.Fatalf("after %s: status %s, want %s", op, in.State.Status, want)
	}
	tr, class := sandbox.Allowed(from, op)
	if class != nil || (tr.To != want) {
		t.Fatalf("the table says %s on %s gives %+v / %v, the service gave %s", op, from, tr, class, want)
	}
}

func execOut(t *testing.T, s *Service, name string, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	st, err := s.Exec(context.Background(), ExecRequest{Name: name, Args: args}, ExecIO{Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("exec %v: %v", args, err)
	}
	return out.String(), st.Code
}

// TestStateTableVM walks one real sandbox through every status a test
// can reach on purpose and runs there the operations TestStateTable
// cannot (those that boot a guest and those a supervisor carries out),
// checking each lands where the table says. Among them the paused-policy
// fix: a profile change on a paused sandbox reaches its supervisor, is
// logged, and is what is enforced after resume.
func TestStateTableVM(t *testing.T) {
	s := vmService(t)
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello from host") }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	prof := filepath.Join(t.TempDir(), "hp.yaml")
	os.WriteFile(prof, []byte("extends: dev\nnetwork:\n  mode: default-deny\n  host_ports: ["+port+"]\n"), 0o600)
	fetch := []string{"sh", "-c", `printf "GET / HTTP/1.0\r\n\r\n" | nc -w 10 host.smx.internal ` + port}

	const name = "walk"
	if _, err := s.Create(ctx, CreateRequest{Name: name, Memory: "256M", Profile: prof}); err != nil {
		t.Fatal(err)
	}
	step := func(op sandbox.Op, from, want sandbox.Status) {
		t.Helper()
		if err := ops[op](ctx, s, name); err != nil {
			t.Fatalf("%s on %s: %v", op, from, err)
		}
		wantStatus(t, s, name, op, from, want)
	}
	refused := func(op sandbox.Op, class error) {
		t.Helper()
		if err := ops[op](ctx, s, name); !errors.Is(err, class) {
			t.Fatalf("%s: %v, want class %s", op, err, errdefs.Class(class))
		}
	}

	step(sandbox.OpStart, sandbox.StatusCreated, sandbox.StatusRunning)
	if out, code := execOut(t, s, name, fetch...); code != 0 || !strings.Contains(out, "hello from host") {
		t.Fatalf("fetch before the change: %d %q", code, out)
	}
	refused(sandbox.OpStart, errdefs.ErrExists)
	refused(sandbox.OpRemove, errdefs.ErrInUse)
	// What only the supervisor may ask of the guest is not relayed, and
	// the refusal's class crosses the socket.
	for _, op := range []string{agentproto.OpInstallCA, agentproto.OpSetTime, agentproto.OpPowerOff, agentproto.OpMount} {
		conn, err := sandbox.DialSocket(ctx, s.manager().Paths(name).Socket())
		if err != nil {
			t.Fatal(err)
		}
		supproto.WriteRequest(conn, &supproto.Request{Op: op})
		_, err = supproto.ReadResult(conn)
		conn.Close()
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("%s sent to the supervisor's socket: %v, want refused as invalid", op, err)
		}
	}
	step(sandbox.OpResume, sandbox.StatusRunning, sandbox.StatusRunning)
	if _, err := s.CreateSnapshot(ctx, SnapshotRequest{Sandbox: name, Name: "walk-s1"}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s, name, sandbox.OpSnapshot, sandbox.StatusRunning, sandbox.StatusRunning)

	// Paused: the profile change reaches the supervisor.
	step(sandbox.OpPause, sandbox.StatusRunning, sandbox.StatusPaused)
	step(sandbox.OpPause, sandbox.StatusPaused, sandbox.StatusPaused)
	refused(sandbox.OpExec, errdefs.ErrFailed)
	r, err := s.SetPolicy(ctx, PolicyRequest{Name: name, Profile: "locked"})
	if err != nil || !r.Applied {
		t.Fatalf("SetPolicy on a paused sandbox = %+v, %v; want applied by the supervisor", r, err)
	}
	wantStatus(t, s, name, sandbox.OpPolicy, sandbox.StatusPaused, sandbox.StatusPaused)
	var changes []audit.Record
	s.Logs(ctx, LogsRequest{Name: name}, func(r audit.Record) error {
		if r.Kind == audit.KindProfileChange {
			changes = append(changes, r)
		}
		return nil
	})
	if len(changes) != 1 || changes[0].Fields["profile"] != "locked" || changes[0].Fields["new_hash"] != r.Hash {
		t.Fatalf("profile.change records after the change on a paused sandbox: %+v", changes)
	}
	if _, err := s.CreateSnapshot(ctx, SnapshotRequest{Sandbox: name, Name: "walk-s2"}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s, name, sandbox.OpSnapshot, sandbox.StatusPaused, sandbox.StatusPaused)
	step(sandbox.OpResume, sandbox.StatusPaused, sandbox.StatusRunning)
	if out, code := execOut(t, s, name, fetch...); code == 0 && strings.Contains(out, "hello from host") {
		t.Fatalf("after resume the old profile is still enforced: %q", out)
	}
	refusals, _ := audit.Read(audit.Dir(s.state.Logs(), name), audit.Filter{Refusals: true})
	if len(refusals) == 0 {
		t.Fatal("the refused fetch after resume is not in the log")
	}
	step(sandbox.OpPolicy, sandbox.StatusRunning, sandbox.StatusRunning)
	step(sandbox.OpPort, sandbox.StatusRunning, sandbox.StatusRunning)
	if l, err := s.Ports(ctx, name); err != nil || !l.Running || len(l.Ports) != 1 || l.Ports[0].Bound == 0 {
		t.Fatalf("ports after publishing 0:80 on a running sandbox: %+v, %v", l, err)
	}

	// Suspended, from running and from paused; back by resume and by start.
	step(sandbox.OpSuspend, sandbox.StatusRunning, sandbox.StatusSuspended)
	refused(sandbox.OpExec, errdefs.ErrFailed)
	step(sandbox.OpResume, sandbox.StatusSuspended, sandbox.StatusRunning)
	step(sandbox.OpPause, sandbox.StatusRunning, sandbox.StatusPaused)
	step(sandbox.OpSuspend, sandbox.StatusPaused, sandbox.StatusSuspended)
	step(sandbox.OpStart, sandbox.StatusSuspended, sandbox.StatusRunning)
	if _, code := execOut(t, s, name, "true"); code != 0 {
		t.Fatalf("exec after start from suspended: exit %d", code)
	}

	// Stopped, from running and from paused.
	step(sandbox.OpStop, sandbox.StatusRunning, sandbox.StatusStopped)
	step(sandbox.OpStart, sandbox.StatusStopped, sandbox.StatusRunning)
	step(sandbox.OpPause, sandbox.StatusRunning, sandbox.StatusPaused)
	step(sandbox.OpStop, sandbox.StatusPaused, sandbox.StatusStopped)

	// Crashed: the supervisor killed.
	step(sandbox.OpStart, sandbox.StatusStopped, sandbox.StatusRunning)
	in, _ := s.Inspect(ctx, name)
	syscall.Kill(in.State.SupervisorPID, syscall.SIGKILL)
	for deadline := time.Now().Add(10 * time.Second); sandbox.SupervisorAlive(s.manager().Paths(name)); {
		if time.Now().After(deadline) {
			t.Fatal("the killed supervisor still holds its lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	wantCrashed, _ := s.Inspect(ctx, name)
	if wantCrashed.State.Status != sandbox.StatusCrashed {
		t.Fatalf("after SIGKILL of the supervisor: %s", wantCrashed.State.Status)
	}
	step(sandbox.OpStart, sandbox.StatusCrashed, sandbox.StatusRunning)

	// A fork of the snapshot taken on the paused sandbox runs.
	fork, err := s.Restore(ctx, RestoreRequest{Snapshot: "walk-s2", Name: "walk-fork"})
	if err != nil || fork.State.Status != sandbox.StatusRunning {
		t.Fatalf("restore: %+v %v", fork, err)
	}
	if out, code := execOut(t, s, "walk-fork", "hostname"); code != 0 || strings.TrimSpace(out) != "walk-fork" {
		t.Fatalf("fork's hostname: %d %q", code, out)
	}
	// rm -f of a paused and of a running sandbox.
	if _, err := s.Pause(ctx, "walk-fork"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"walk-fork", name} {
		if err := s.Remove(ctx, RemoveRequest{Name: n, Force: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Inspect(ctx, n); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("after rm -f: %v", err)
		}
	}
	if done, err := s.RemoveSnapshots(ctx, []string{"walk-s1", "walk-s2"}); err != nil || len(done) != 2 {
		t.Fatalf("snapshot rm: %v %v", done, err)
	}
}

// A stop does not queue behind a snapshot in progress: the save is
// abandoned (nothing is published, nothing logged as saved) and the
// sandbox stops. With the save capped at 1 MiB/s it would take many
// seconds; before the fix the stop waited for it, and the snapshot
// completed.
func TestStopAbandonsSnapshot(t *testing.T) {
	t.Setenv("SMX_SAVE_BANDWIDTH", "1048576")
	s := vmService(t)
	ctx := context.Background()
	if _, err := s.Create(ctx, CreateRequest{Name: "slow", Memory: "256M"}); err != nil {
		t.Fatal(err)
	}
	// Cold: no boot template is saved (it would be capped too).
	if _, err := s.Start(ctx, StartRequest{Name: "slow", Cold: true}); err != nil {
		t.Fatal(err)
	}
	saving := make(chan struct{})
	var once sync.Once
	res := make(chan error, 1)
	go func() {
		_, err := s.CreateSnapshot(ctx, SnapshotRequest{Sandbox: "slow", Name: "slow-s",
			Progress: func(int64) { once.Do(func() { close(saving) }) }})
		res <- err
	}()
	select {
	case <-saving: // the save has been writing for a second
	case err := <-res:
		t.Fatalf("the save ended within a second (%v): is SMX_SAVE_BANDWIDTH applied?", err)
	}
	if _, err := s.Stop(ctx, StopRequest{Name: "slow", Timeout: 10 * time.Second}); err != nil {
		t.Fatalf("stop during a snapshot: %v", err)
	}
	wantStatus(t, s, "slow", sandbox.OpStop, sandbox.StatusRunning, sandbox.StatusStopped)
	if err := <-res; err == nil {
		t.Fatal("the snapshot completed: the stop waited behind it")
	}
	if list, _ := s.ListSnapshots(ctx); len(list) != 0 {
		t.Fatalf("an abandoned snapshot is listed: %+v", list)
	}
	var saved []audit.Record
	s.Logs(ctx, LogsRequest{Name: "slow"}, func(r audit.Record) error {
		if r.Kind == audit.KindSnapshotCreate {
			saved = append(saved, r)
		}
		return nil
	})
	if len(saved) != 0 {
		t.Fatalf("an abandoned snapshot is logged as saved: %+v", saved)
	}
}
