package cli_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestRestoreRepeatedly restores one snapshot ten times, one after the
// other and without pause: every fork must answer on its control channel
// (the guest still holds the yamux session of the supervisor that saved
// it) and keep the counter of its source running.
func TestRestoreRepeatedly(t *testing.T) {
	v := startSandbox(t, "rr-src", "--memory", "256M")
	counter := `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1 &`
	if out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", counter); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// Streams in flight at save time must not break the forks: one runs
	// across the snapshot.
	busy := v.cmd("agent", "exec", v.name, "--", "sh", "-c", "while :; do echo x; sleep 0.01; done")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	defer busy.Process.Kill()
	snap := "rr-snap"
	v.smx("snapshot", "rm", snap)
	if out, err := v.smx("snapshot", "create", v.name, "--name", snap); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("snapshot", "rm", snap) })
	for i := range 10 {
		name := fmt.Sprintf("rr-fork%d", i)
		if out, err := v.smx("agent", "restore", snap, "--name", name); err != nil {
			v.smx("agent", "rm", "-f", name)
			t.Fatalf("restore %d: %v\n%s", i, err, out)
		}
		out, err := v.smx("agent", "exec", name, "--", "sh", "-c", "hostname; a=$(cat /tmp/count); sleep 0.3; b=$(cat /tmp/count); [ $b -gt $a ] && echo counting")
		v.smx("agent", "rm", "-f", name)
		if err != nil || !strings.Contains(out, name+"\n") || !strings.Contains(out, "counting") {
			t.Fatalf("fork %d: %v\n%s", i, err, out)
		}
	}
	// The source still works after all that.
	if out, err := v.smx("agent", "exec", v.name, "--", "true"); err != nil {
		t.Fatalf("source: %v\n%s", err, out)
	}
}
