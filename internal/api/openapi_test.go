package api_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/testutil"
)

// TestOpenAPIRoutes: every route in api/openapi.yaml is served, and every
// route served is in the document.
func TestOpenAPIRoutes(t *testing.T) {
	doc, _ := openAPI(t)
	var inDoc, served []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			inDoc = append(inDoc, method+" "+path)
		}
	}
	for _, r := range (&api.Server{}).Routes() {
		served = append(served, r.Method+" "+r.Path)
	}
	slices.Sort(inDoc)
	slices.Sort(served)
	for _, r := range served {
		if !slices.Contains(inDoc, r) {
			t.Errorf("served but not in api/openapi.yaml: %s", r)
		}
	}
	for _, r := range inDoc {
		if !slices.Contains(served, r) {
			t.Errorf("in api/openapi.yaml but not served: %s", r)
		}
	}
	// The file in the repository is the one the binary serves.
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(), "api", "openapi.yaml"))
	if err != nil || len(b) == 0 {
		t.Fatal(err)
	}
}

// TestTCPNeedsToken: a TCP listener needs a token file, and refuses every
// request without the token, or with a wrong one, as 401.
func TestTCPNeedsToken(t *testing.T) {
	bin := testutil.Binaries(t)
	home := t.TempDir()
	out, err := testutil.SmxCmd(bin, home, "serve", "--listen", "tcp:127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "token") {
		t.Fatalf("TCP without a token: err %v, output %s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	token := "s3cret-token-0123456789"
	tf := filepath.Join(home, "token")
	os.WriteFile(tf, []byte(token+"\n"), 0o600)
	serve(t, bin, home, "--listen", "tcp:"+addr, "--token-file", tf)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, bad := range []string{"", "wrong-token-0123456789"} {
		_, err := client.NewTCP(addr, bad).List(ctx)
		var ae *client.APIError
		if !errorsAs(err, &ae) || ae.Status != 401 || !errorsIs(err, client.ErrDenied) {
			t.Errorf("token %q: got %v, want 401 denied", bad, err)
		}
		// The exec WebSocket is refused before the upgrade too.
		_, err = client.NewTCP(addr, bad).Exec(ctx, "x", client.ExecRequest{Args: []string{"true"}}, client.ExecIO{})
		if !errorsAs(err, &ae) || ae.Status != 401 {
			t.Errorf("exec with token %q: got %v, want 401", bad, err)
		}
	}
	info, err := client.NewTCP(addr, token).Info(ctx)
	if err != nil || info.API != "v1" {
		t.Fatalf("with the token: %v %+v", err, info)
	}
	if _, err := client.NewTCP(addr, token).List(ctx); err != nil {
		t.Fatal(err)
	}

	// The Python clients, sync and asyncio, send the token too.
	if py, err := exec.LookPath("python3"); err == nil {
		host, port, _ := net.SplitHostPort(addr)
		script := `
import asyncio, sys, smx
host, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
assert smx.Client(tcp=(host, port), token=token).info()["api"] == "v1"
assert asyncio.run(smx.AsyncClient(tcp=(host, port), token=token).list()) == []
for bad in (None, "wrong-token-0123456789"):
    try:
        smx.Client(tcp=(host, port), token=bad).list()
        raise SystemExit("no token accepted")
    except smx.Denied as e:
        assert e.status == 401, e.status
    try:
        asyncio.run(smx.AsyncClient(tcp=(host, port), token=bad).list())
        raise SystemExit("no token accepted (async)")
    except smx.Denied as e:
        assert e.status == 401, e.status
print("python ok")
`
		cmd := exec.Command(py, "-c", script, host, port, token)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(testutil.RepoRoot(), "python", "src"))
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "python ok") {
			t.Errorf("python over TCP: %v\n%s", err, out)
		}
	}
}
