package cli_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestAgentExit: an agent's exit ends its sandbox as a container's main
// process ends its container. Detached (-d), the sandbox stops once the
// agent exits, and ls, inspect and the log carry its exit status; with
// --rm it is removed (its log stays); attached with --rm, `smx agent run`
// exits with the agent's status and the sandbox is gone.
func TestAgentExit(t *testing.T) {
	bin, home := claudeStandIn(t, `command: [sh, -c, 'sleep "${1:-2}"; exit 5', agent]`)

	v := &vmEnv{t: t, bin: bin, home: home}
	const det, detRm, attRm, snapped = "exit-d", "exit-d-rm", "exit-rm", "exit-snap"
	t.Cleanup(func() {
		for _, n := range []string{det, detRm, attRm, snapped} {
			v.smx("agent", "rm", "-f", n)
		}
	})
	work := t.TempDir()
	for _, n := range []string{det, detRm} {
		args := []string{"agent", "run", "claude", work, "-d", "--name", n, "--memory", "512M"}
		if n == detRm {
			args = append(args, "--rm")
		}
		if out, err := v.smx(args...); err != nil || strings.TrimSpace(lastLine(out)) != n {
			t.Fatalf("run -d %s: %v\n%s", n, err, out)
		}
	}
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		for end := time.Now().Add(3 * time.Minute); !ok(); time.Sleep(time.Second) {
			if time.Now().After(end) {
				t.Fatalf("timed out waiting until %s", what)
			}
		}
	}
	waitUntil("the detached agent's sandbox stopped", func() bool {
		ls, _ := v.smx("agent", "ls")
		return strings.Contains(ls, "stopped (exited 5)")
	})
	if out, _ := v.smx("agent", "inspect", det); !strings.Contains(out, "Exited:   5 at") {
		t.Errorf("inspect:\n%s", out)
	}
	var in struct {
		State struct{ Status string }
		Agent *struct {
			ExitCode *int `json:"exit_code"`
		}
	}
	out, _ := v.smx("agent", "inspect", det, "--json")
	if err := json.Unmarshal([]byte(out), &in); err != nil || in.Agent == nil || in.Agent.ExitCode == nil || *in.Agent.ExitCode != 5 || in.State.Status != "stopped" {
		t.Errorf("inspect --json: %v\n%s", err, out)
	}
	logged := func(n string) bool {
		out, _ := v.smx("agent", "logs", n, "--json")
		for l := range strings.SplitSeq(out, "\n") {
			if strings.Contains(l, `"run.end"`) && strings.Contains(l, `"exit_code":5`) {
				return true
			}
		}
		return false
	}
	if !logged(det) {
		t.Errorf("no run.end with exit_code 5 in the log of %s", det)
	}
	waitUntil("the --rm sandbox is removed", func() bool {
		_, err := v.smx("agent", "inspect", detRm)
		return err != nil
	})
	if !logged(detRm) {
		t.Errorf("no run.end with exit_code 5 in the log of the removed %s", detRm)
	}

	// A snapshot taken while the agent runs does not lose the watch: the
	// agent's exit still stops the sandbox.
	if out, err := v.smx("agent", "run", "claude", work, "-d", "--name", snapped, "--memory", "512M", "--", "25"); err != nil {
		t.Fatalf("run -d %s: %v\n%s", snapped, err, out)
	}
	if out, err := v.smx("snapshot", "create", snapped, "--name", snapped+"-snap"); err != nil {
		t.Fatalf("snapshot: %v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("snapshot", "rm", snapped+"-snap") })
	if out, _ := v.smx("agent", "inspect", snapped); !strings.Contains(out, "Status:   running") {
		t.Fatalf("the agent ended before the snapshot was taken:\n%s", out)
	}
	waitUntil("the snapshotted agent's sandbox stopped", func() bool {
		out, _ := v.smx("agent", "inspect", snapped)
		return strings.Contains(out, "Exited:   5 at")
	})

	// Attached, --rm: smx exits with the agent's status, the sandbox goes.
	c := v.cmd("agent", "run", "claude", work, "--rm", "--name", attRm, "--memory", "512M")
	c.Stdin = strings.NewReader("")
	b, err := c.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 5 || !strings.Contains(string(b), "sandbox "+attRm+" removed") {
		t.Fatalf("attached --rm: %v\n%s", err, b)
	}
	if _, err := v.smx("agent", "inspect", attRm); err == nil {
		t.Errorf("the sandbox of an attached --rm run is still there")
	}
}

// claudeStandIn makes a state directory whose claude preset runs command
// (a preset YAML `command:` line) instead of the Claude CLI, in the
// preset's real image: the agent tests' world without a model.
func claudeStandIn(t *testing.T, command string) (bin, home string) {
	t.Helper()
	testutil.RequireQEMU(t)
	bin = testutil.Binaries(t)
	home = t.TempDir()
	testutil.AwaitSandboxesGone(t, bin, home)
	os.Symlink(testutil.KernelCache(t), filepath.Join(home, "kernels"))
	presetImage(t, home, "claude")
	overridePreset(t, home, "claude", "command: [claude, --dangerously-skip-permissions]", command)
	return bin, home
}
