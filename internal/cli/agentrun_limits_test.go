package cli_test

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestAgentRunLimits (issue 29): `smx agent run --rm --timeout` stops the
// sandbox under an attached CLI, which says so in one line (exit 125),
// and removes it; `--idle-stop` stops a detached agent that sits silent
// (the agent's own execs, its wait above all, are not activity) and the
// watcher removes it. Both leave their record in the log.
func TestAgentRunLimits(t *testing.T) {
	bin, home := claudeStandIn(t, `command: [sleep, "600"]`)

	v := &vmEnv{t: t, bin: bin, home: home, name: "limrm"}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", "limrm"); v.smx("agent", "rm", "-f", "limidle") })
	gone := func(name string) {
		t.Helper()
		for end := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
			out, _ := v.smx("agent", "ls")
			if !strings.Contains(out, name) {
				return
			}
			if time.Now().After(end) {
				t.Fatalf("sandbox %s not removed:\n%s", name, out)
			}
		}
	}
	logged := func(name string, kinds ...string) {
		t.Helper()
		out, err := v.smx("agent", "logs", name)
		if err != nil {
			t.Fatalf("logs: %v\n%s", err, out)
		}
		for _, k := range kinds {
			if !strings.Contains(out, k) {
				t.Errorf("log of %s has no %s:\n%s", name, k, out)
			}
		}
	}

	// Attached (plain output: stdout is not a terminal) with --rm.
	c := v.cmd("agent", "run", "claude", t.TempDir(), "--rm", "--timeout", "20s", "--name", "limrm", "--memory", "512M")
	var stderr bytes.Buffer
	c.Stderr = &stderr
	timer := time.AfterFunc(4*time.Minute, func() { c.Process.Kill() })
	err := c.Run()
	if !timer.Stop() {
		t.Fatalf("agent run did not end in 4 minutes\nstderr:\n%s", stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 125 {
		t.Errorf("exit: %v, want status 125\nstderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "smx: sandbox limrm stopped: --timeout 20s reached\n") {
		t.Errorf("stderr does not say why:\n%s", stderr.String())
	}
	gone("limrm")
	logged("limrm", "sandbox.timeout", "sandbox.remove")

	// Detached, silent: idle although its agent and the agent's wait run.
	if out, err := v.smx("agent", "run", "claude", t.TempDir(), "-d", "--rm", "--idle-stop", "8s", "--name", "limidle", "--memory", "512M"); err != nil {
		t.Fatalf("agent run -d: %v\n%s", err, out)
	}
	gone("limidle")
	logged("limidle", "sandbox.idle", "sandbox.remove")
}
