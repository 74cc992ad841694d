package cli_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestRestoreRepeatedly restores one snapshot ten times, one after the
// other and without pause: every fork must answer on its control channel
// (the guest still holds the yamux session of the supervisor that saved
// it) and keep the counter of its source running.
func TestRestoreRepeatedly(t *testing.T) {
	v := startSandbox(t, "rr-src", "--memory", "256M")
	// Each value is renamed into place, so a reader never sees a file half written.
	counter := `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1 &`
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

// TestSnapshotDiskFull saves a snapshot onto a filesystem too small for
// the memory state: the save fails with the reason, no half snapshot is
// listed or left behind, and the sandbox keeps running. Then, with room,
// the snapshot pins the image it was made from.
func TestSnapshotDiskFull(t *testing.T) {
	testutil.RequireQEMU(t)
	testutil.Require(t, os.Geteuid() == 0, "root", "run as root to mount a small tmpfs")
	bin := testutil.Binaries(t)
	kernels := testutil.KernelCache(t)
	home := t.TempDir()
	os.Symlink(kernels, filepath.Join(home, "kernels"))
	v := &vmEnv{t: t, bin: bin, home: home, name: "full-src"}
	if out, err := v.smx("image", "build", "busybox"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	snaps := filepath.Join(home, "snapshots")
	os.MkdirAll(snaps, 0o700)
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", snaps).CombinedOutput(); err != nil {
		testutil.Require(t, false, "tmpfs mount", fmt.Sprintf("%v: %s", err, out))
	}
	mounted := true
	defer func() {
		if mounted {
			exec.Command("umount", snaps).Run()
		}
	}()
	if out, err := v.smx("agent", "create", v.name, "--memory", "256M"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	defer v.smx("agent", "rm", "-f", v.name)
	if out, err := v.smx("agent", "start", v.name); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := v.smx("snapshot", "create", v.name, "--name", "full")
	if err == nil {
		t.Fatalf("snapshot onto a 24 MiB filesystem succeeded:\n%s", out)
	}
	if !strings.Contains(strings.ToLower(out), "no space left on device") {
		t.Fatalf("error does not give the reason:\n%s", out)
	}
	if ls, _ := v.smx("snapshot", "ls"); strings.Contains(ls, "full") {
		t.Fatalf("half snapshot listed:\n%s", ls)
	}
	if ents, _ := os.ReadDir(snaps); len(ents) != 1 || ents[0].Name() != ".lock" {
		out, _ := exec.Command("ls", "-la", snaps).CombinedOutput()
		t.Logf("%s", out)
		t.Fatalf("leftovers in the snapshot directory: %v", ents)
	}
	if out, err := v.smx("agent", "exec", v.name, "--", "echo", "still-running"); err != nil || !strings.Contains(out, "still-running") {
		t.Fatalf("sandbox not running after a failed save: %v\n%s", err, out)
	}

	exec.Command("umount", snaps).Run()
	mounted = false
	if out, err := v.smx("snapshot", "create", v.name, "--name", "roomy", "--stop"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	v.smx("agent", "rm", "-f", v.name)
	if out, err := v.smx("image", "rm", "busybox"); err == nil || !strings.Contains(out, "uses it") {
		t.Fatalf("image removed while a snapshot depends on it: %v\n%s", err, out)
	}
	if out, err := v.smx("snapshot", "rm", "roomy"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := v.smx("image", "rm", "busybox"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
