package api_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/preset"
	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/presets"
)

// agentPreset links the claude preset's image (built once by
// scripts/test.sh into $SMX_TEST_IMAGES) into home and installs, as the
// server user's own claude preset (same recipe, so the same image), one
// whose command is cmd.
func agentPreset(t *testing.T, home, cmd string) {
	t.Helper()
	p, err := preset.Get("claude", "")
	if err != nil {
		t.Fatal(err)
	}
	img, dir := p.ImageName(), os.Getenv("SMX_TEST_IMAGES")
	_, err = os.Stat(filepath.Join(dir, img, "image.json"))
	testutil.Require(t, dir != "" && err == nil, "the claude preset's image "+img,
		"run scripts/test.sh, which builds it once (`smx image preset claude` into $SMX_TEST_IMAGES)")
	if err := os.Symlink(filepath.Join(dir, img), filepath.Join(home, "images", img)); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	shipped, err := presets.FS.ReadFile("claude.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const line = "command: [claude, --dangerously-skip-permissions]"
	if !bytes.Contains(shipped, []byte(line)) {
		t.Fatalf("claude.yaml has no %q line", line)
	}
	udir := filepath.Join(home, ".config", "smx", "presets") // XDG_CONFIG_HOME of testutil.SmxCmd
	os.MkdirAll(udir, 0o755)
	if err := os.WriteFile(filepath.Join(udir, "claude.yaml"), bytes.Replace(shipped, []byte(line), []byte("command: "+cmd), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(filepath.Join(udir, "claude.yaml")) })
}

// TestAgentAPI launches a preset's agent through POST /v1/agents on a
// real `smx serve` with a real VM: the answer streams progress, then the
// agent running on the workspace; when the agent exits the sandbox stops
// and GET /v1/agents/{name} (and the log's run.end) carry its exit
// status; with remove the sandbox is deleted and its log stays.
func TestAgentAPI(t *testing.T) {
	_, home, sock := vmServer(t)
	agentPreset(t, home, `[sh, -c, 'id -un > /work/who; echo "$@" > /work/args; sleep 2; exit 3', agent]`)
	c, _ := checkedClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const name, rmName = "apiagent", "apiagent-rm"
	t.Cleanup(func() {
		c.Remove(context.Background(), name, true)
		c.Remove(context.Background(), rmName, true)
	})

	// Refusals: before any progress an ordinary error answer, after it
	// (the missing key is warned about first) the stream's error line.
	_, err := c.RunAgent(ctx, client.AgentRequest{Preset: "nosuch", Workspace: "/"}, nil)
	wantClass(t, "unknown preset", err, 404, client.ErrNotFound)
	_, err = c.RunAgent(ctx, client.AgentRequest{Preset: "claude", Workspace: "rel/dir"}, nil)
	wantClass(t, "relative workspace", err, 400, client.ErrInvalid)
	_, err = c.RunAgent(ctx, client.AgentRequest{Preset: "claude", Workspace: filepath.Join(t.TempDir(), "none")}, nil)
	if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), "is not a folder") {
		t.Errorf("missing workspace: %v", err)
	}

	work := t.TempDir()
	os.Chmod(work, 0o777)
	var stages []string
	a, err := c.RunAgent(ctx, client.AgentRequest{Preset: "claude", Workspace: work, Name: name, Memory: "512M", Args: []string{"one", "two"}},
		func(ev client.AgentEvent) { stages = append(stages, ev.Stage) })
	if err != nil {
		t.Fatalf("run agent: %v", err)
	}
	if a.Sandbox.Name != name || a.Preset != "claude" || a.Workspace != work || a.ExitCode != nil {
		t.Errorf("agent: %+v", a)
	}
	for _, want := range []string{"warning", "create", "start", "agent"} {
		if !slices.Contains(stages, want) {
			t.Errorf("no progress stage %s in %v", want, stages)
		}
	}
	a = waitAgentExit(t, c, name)
	if a.ExitCode == nil || *a.ExitCode != 3 || a.Sandbox.Status != "stopped" || a.Exited == nil {
		t.Errorf("after the agent exited 3: %+v (status %s)", a, a.Sandbox.Status)
	}
	if b, _ := os.ReadFile(filepath.Join(work, "who")); string(b) != "user\n" {
		t.Errorf("the agent ran as %q, want the preset's user", b)
	}
	if b, _ := os.ReadFile(filepath.Join(work, "args")); string(b) != "one two\n" {
		t.Errorf("the agent's arguments: %q", b)
	}
	if code, ok := loggedRunEnd(t, c, name); !ok || code != 3 {
		t.Errorf("log: run.end exit_code %d (found %v), want 3", code, ok)
	}

	// remove: the sandbox goes once the agent has exited; its log stays.
	if _, err := c.RunAgent(ctx, client.AgentRequest{Preset: "claude", Workspace: work, Name: rmName, Memory: "512M", Remove: true}, nil); err != nil {
		t.Fatalf("run agent with remove: %v", err)
	}
	for end := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		_, err := c.Agent(ctx, rmName)
		if errors.Is(err, client.ErrNotFound) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the sandbox of an agent run with remove is still there: %v", err)
		}
	}
	if code, ok := loggedRunEnd(t, c, rmName); !ok || code != 3 {
		t.Errorf("log after remove: run.end exit_code %d (found %v), want 3", code, ok)
	}

	// The same through the Python client, sync and asyncio.
	py, err := exec.LookPath("python3")
	testutil.Require(t, err == nil, "python3", "apt-get install python3 python3-venv python3-pip (scripts/test.sh does)")
	venv := filepath.Join(t.TempDir(), "venv")
	if out, err := exec.Command(py, "-m", "venv", venv).CombinedOutput(); err != nil {
		testutil.Require(t, false, "python3 -m venv", "apt-get install python3-venv: "+string(out))
	}
	pip := exec.Command(filepath.Join(venv, "bin", "python"), "-m", "pip", "install", "--no-index", "--quiet",
		filepath.Join(testutil.RepoRoot(), "python"))
	pip.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_INPUT=1")
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install ./python: %v\n%s", err, out)
	}
	pywork := t.TempDir()
	os.Chmod(pywork, 0o777)
	t.Cleanup(func() {
		c.Remove(context.Background(), "pyagent", true)
		c.Remove(context.Background(), "pyagent-rm", true)
	})
	cmd := exec.Command(filepath.Join(venv, "bin", "python"), filepath.Join(testutil.RepoRoot(), "python", "tests", "agent_scenario.py"), sock, pywork, "pyagent")
	cmd.Dir = t.TempDir()
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "agent scenario ok") {
		t.Fatalf("python agent scenario: %v\n%s", err, out)
	}
}

func waitAgentExit(t *testing.T, c *client.Client, name string) *client.Agent {
	t.Helper()
	for end := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		a, err := c.Agent(context.Background(), name)
		if err != nil {
			t.Fatalf("agent %s: %v", name, err)
		}
		if a.ExitCode != nil && a.Sandbox.Status == "stopped" {
			return a
		}
		if time.Now().After(end) {
			t.Fatalf("agent %s did not end: %+v", name, a)
		}
	}
}

func loggedRunEnd(t *testing.T, c *client.Client, name string) (int, bool) {
	code, ok := 0, false
	err := c.Logs(context.Background(), name, client.LogOptions{}, func(r client.Record) error {
		if r.Kind == "run.end" {
			if n, isNum := r.Fields["exit_code"].(float64); isNum {
				code, ok = int(n), true
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("logs %s: %v", name, err)
	}
	return code, ok
}
