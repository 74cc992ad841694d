package sandbox

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/statedir"
)

// parkedHelper, run as a parked supervisor by TestParked, does what
// smx's __supervise does with a sandbox it is handed: Unpark, then say so
// on its log (stdout) and on the ready pipe.
func init() {
	if os.Getenv("SMX_TEST_PARKED_HELPER") != "1" {
		return
	}
	m := &Manager{State: statedir.Dir{Root: os.Getenv("SMX_HOME")}}
	name, ok, err := Unpark(m)
	if err != nil || !ok {
		os.Exit(3)
	}
	wd, _ := os.Getwd()
	fmt.Printf("supervising %s in %s, owner fd %s\n", name, wd, os.Getenv("SMX_OWNER_FD"))
	fmt.Fprintln(os.NewFile(3, "ready"), "ok")
	os.Exit(0)
}

// A supervisor parked before its sandbox exists is handed the sandbox
// once it does: it runs in the sandbox's directory with its output in the
// sandbox's supervisor log, and the start waits for its word as for any
// supervisor. One let go without a sandbox exits.
func TestParked(t *testing.T) {
	m := &Manager{State: statedir.Dir{Root: t.TempDir()}}
	if err := m.State.Ensure(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SMX_TEST_PARKED_HELPER", "1")
	argv := []string{os.Args[0], "-test.run=^$"}
	or, ow, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer ow.Close()
	pk, err := m.Park(argv, or)
	or.Close()
	if err != nil {
		t.Fatal(err)
	}
	p, err := m.Create(Spec{Name: "late", Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := pk.Start(ctx, "late"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p.Log())
	if want := fmt.Sprintf("supervising late in %s, owner fd %d\n", p.Dir, OwnerFD); string(b) != want {
		t.Fatalf("supervisor log %q, want %q", b, want)
	}

	pk, err = m.Park(argv, nil)
	if err != nil {
		t.Fatal(err)
	}
	pid := pk.cmd.Process.Pid
	pk.Cancel()
	for end := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("a parked supervisor let go is still running after 10 s")
		}
	}
	if es, err := os.ReadDir(m.State.Sandboxes()); err != nil || len(es) != 1 || strings.TrimSpace(es[0].Name()) != "late" {
		t.Fatalf("sandboxes: %v %v", es, err)
	}
}
