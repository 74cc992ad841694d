package mcpserver_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/smx-dev/smx/internal/mcpserver"
	"github.com/smx-dev/smx/internal/testutil"
)

var testBin string

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.CleanupSmxHome(testBin)
	os.Exit(code)
}

// callTool calls tool over sess and returns the text of its answer and
// whether the tool reported an error; a protocol error fails the test.
func callTool(ctx context.Context, t *testing.T, sess *mcp.ClientSession, tool string, args map[string]any) (string, bool) {
	t.Helper()
	res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", tool, err)
	}
	var text string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	return text, res.IsError
}

// TestMCP drives `smx mcp` with the MCP Go SDK's client over stdio, as an
// MCP host would: list the tools, then create, exec, cp, snapshot, fork,
// logs (read and verify) and rm on real VMs.
func TestMCP(t *testing.T) {
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	testBin = bin
	home := testutil.SmxHome(t, bin)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	cmd := testutil.SmxCmd(bin, home, "mcp")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cl := mcp.NewClient(&mcp.Implementation{Name: "smx-test", Version: "1"}, nil)
	sess, err := cl.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer sess.Close()
	const name, snap, fork = "mcp1", "mcp1-snap", "mcp1-fork"
	defer func() {
		for _, n := range []string{fork, name} {
			testutil.SmxCmd(bin, home, "agent", "rm", "-f", n).Run()
		}
		testutil.SmxCmd(bin, home, "snapshot", "rm", snap).Run()
		if t.Failed() {
			t.Logf("smx mcp stderr:\n%s", stderr.String())
		}
	}()

	tools, err := sess.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
		if tl.Description == "" || tl.InputSchema == nil {
			t.Errorf("tool %s has no description or schema", tl.Name)
		}
	}
	for _, want := range []string{"sandbox_create", "sandbox_exec", "sandbox_cp", "sandbox_snapshot", "sandbox_fork", "sandbox_logs", "sandbox_rm", "sandbox_ls", "agent_run", "agent_inspect", "approvals_list", "approval_answer"} {
		if !slices.Contains(names, want) {
			t.Errorf("no tool %s in %v", want, names)
		}
	}

	call := func(tool string, args map[string]any) (map[string]any, bool) {
		t.Helper()
		text, isErr := callTool(ctx, t, sess, tool, args)
		if isErr {
			return map[string]any{"error": text}, true
		}
		var out map[string]any
		if err := json.Unmarshal([]byte(text), &out); err != nil {
			t.Fatalf("%s: answer is not a JSON object: %v: %s", tool, err, text)
		}
		return out, false
	}
	mustCall := func(tool string, args map[string]any) map[string]any {
		t.Helper()
		out, isErr := call(tool, args)
		if isErr {
			t.Fatalf("%s: %v", tool, out["error"])
		}
		return out
	}

	if sb := mustCall("sandbox_create", map[string]any{"name": name, "memory": "256M", "timeout": "1h", "idle_stop": "30m"}); sb["status"] != "running" {
		t.Fatalf("create: %v", sb)
	} else if sb["timeout"] != "1h" || sb["idle_stop"] != "30m" {
		t.Errorf("create with limits: timeout %v, idle_stop %v", sb["timeout"], sb["idle_stop"])
	}
	if out, isErr := call("sandbox_create", map[string]any{"name": name + "-bad", "timeout": "soon"}); !isErr || !strings.Contains(out["error"].(string), `invalid --timeout "soon"`) {
		t.Errorf("create with a bad timeout: %v", out)
	}
	r := mustCall("sandbox_exec", map[string]any{"sandbox": name, "command": []string{"sh", "-c", "echo out; cat; echo err >&2; exit 3"}, "stdin": "in\n"})
	if r["exit_code"] != float64(3) || r["stdout"] != "out\nin\n" || r["stderr"] != "err\n" {
		t.Errorf("exec: %v", r)
	}
	if out, isErr := call("sandbox_exec", map[string]any{"sandbox": "no-such", "command": []string{"true"}}); !isErr || !strings.Contains(out["error"].(string), "no-such") {
		t.Errorf("exec on a missing sandbox: %v", out)
	}
	if r := mustCall("sandbox_exec", map[string]any{"sandbox": name, "command": []string{"no-such-program"}}); r["exit_code"] != float64(127) || !strings.Contains(r["stderr"].(string), "not found") {
		t.Errorf("exec of a missing program: %v", r)
	}
	if out, isErr := call("sandbox_exec", map[string]any{"sandbox": name}); !isErr {
		t.Errorf("exec without a command: %v", out)
	}

	// cp in, then out.
	src := filepath.Join(t.TempDir(), "mcp-file.txt")
	os.WriteFile(src, []byte("via mcp\n"), 0o644)
	mustCall("sandbox_cp", map[string]any{"sandbox": name, "direction": "in", "host_path": src, "guest_path": "/tmp"})
	dst := t.TempDir()
	mustCall("sandbox_cp", map[string]any{"sandbox": name, "direction": "out", "host_path": dst, "guest_path": "/tmp/mcp-file.txt"})
	if b, err := os.ReadFile(filepath.Join(dst, "mcp-file.txt")); err != nil || string(b) != "via mcp\n" {
		t.Errorf("cp round trip: %v %q", err, b)
	}

	if sn := mustCall("sandbox_snapshot", map[string]any{"sandbox": name, "name": snap}); sn["name"] != snap {
		t.Errorf("snapshot: %v", sn)
	}
	if fk := mustCall("sandbox_fork", map[string]any{"snapshot": snap, "name": fork}); fk["status"] != "running" {
		t.Errorf("fork: %v", fk)
	} else if fk["timeout"] != "1h" || fk["idle_stop"] != "30m" {
		t.Errorf("the fork does not keep its source's limits: timeout %v, idle_stop %v", fk["timeout"], fk["idle_stop"])
	}
	if r := mustCall("sandbox_exec", map[string]any{"sandbox": fork, "command": []string{"cat", "/tmp/mcp-file.txt"}}); r["stdout"] != "via mcp\n" {
		t.Errorf("fork has the file: %v", r)
	}
	logs := mustCall("sandbox_logs", map[string]any{"sandbox": name})
	b, _ := json.Marshal(logs["records"])
	if !strings.Contains(string(b), `"exec.start"`) || !strings.Contains(string(b), `"snapshot.create"`) {
		t.Errorf("logs: %s", b)
	}
	if rep := mustCall("sandbox_logs", map[string]any{"sandbox": name, "verify": true}); rep["ok"] != true {
		t.Errorf("verify: %v", rep)
	}
	// Agents: refusals name what to do (internal/api's TestAgentAPI
	// launches real ones through the same Backend call).
	if out, isErr := call("agent_run", map[string]any{"preset": "nosuch", "workspace": "/"}); !isErr || !strings.Contains(out["error"].(string), "no preset named") {
		t.Errorf("agent_run of an unknown preset: %v", out)
	}
	if out, isErr := call("agent_inspect", map[string]any{"sandbox": name}); !isErr || !strings.Contains(out["error"].(string), "runs no agent") {
		t.Errorf("agent_inspect of a plain sandbox: %v", out)
	}
	ls := mustCall("sandbox_ls", map[string]any{})
	if b, _ := json.Marshal(ls); !strings.Contains(string(b), `"`+fork+`"`) {
		t.Errorf("ls: %s", b)
	}
	for _, n := range []string{fork, name} {
		mustCall("sandbox_rm", map[string]any{"sandbox": n})
	}
	if out, err := testutil.SmxCmd(bin, home, "agent", "ls").CombinedOutput(); err != nil || strings.Contains(string(out), name) {
		t.Errorf("after rm: %v %s", err, out)
	}
}

// TestToolSchemas: every tool's input schema can be inferred (AddTool
// panics otherwise), without a VM.
func TestToolSchemas(t *testing.T) {
	mcpserver.New(nil, "test", nil)
}
