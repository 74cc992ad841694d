package api_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/testutil"
)

// TestCheckProfileWarnings: the API's profile check reports the warnings
// `smx profile check` prints, in the answer api/openapi.yaml describes,
// to the Go and the Python client. The check reads no state, so the
// server runs in-process over no service and boots nothing.
func TestCheckProfileWarnings(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- (&api.Server{Backend: api.ServiceBackend{}}).Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-done })
	c, _ := checkedClient(t, sock)

	const hooks = "files:\n  rules:\n    - path: /work/.git/hooks/**\n      access: rw\n"
	r, err := c.CheckProfile(ctx, hooks)
	if err != nil || !r.OK || len(r.Problems) != 0 || len(r.Warnings) != 1 ||
		!strings.HasPrefix(r.Warnings[0], "profile.yaml:3:") || !strings.Contains(r.Warnings[0], ": warning: ") ||
		!strings.Contains(r.Warnings[0], ".git/hooks") {
		t.Errorf("rw on .git/hooks: %v %+v", err, r)
	}

	const forge = "git:\n  repos:\n    - repo: github.com/acme/app\n      read: allow\n"
	r, err = c.CheckProfile(ctx, forge)
	if err != nil || !r.OK || len(r.Warnings) != 1 || !strings.HasPrefix(r.Warnings[0], "profile.yaml:3:") ||
		!strings.Contains(r.Warnings[0], ": warning: ") || !strings.Contains(r.Warnings[0], "names the forge github.com") ||
		!strings.Contains(r.Warnings[0], "add a network.allow rule `domain: github.com` with `ports: [443]`") {
		t.Errorf("github.com unreachable: %v %+v", err, r)
	}

	// With the network rule the forge is reachable: no warning.
	r, err = c.CheckProfile(ctx, "network:\n  allow:\n    - domain: github.com\n      ports: [443]\n"+forge)
	if err != nil || !r.OK || len(r.Warnings) != 0 {
		t.Errorf("github.com allowed: %v %+v", err, r)
	}
	// A profile with problems is not OK, and its problems come alone.
	r, err = c.CheckProfile(ctx, "network:\n  mode: sideways\n"+forge)
	if err != nil || r.OK || len(r.Problems) == 0 || len(r.Warnings) != 0 {
		t.Errorf("bad profile: %v %+v", err, r)
	}

	py, err := exec.LookPath("python3")
	if err != nil {
		t.Log("no python3: the Python client is not checked")
		return
	}
	script := `
import sys, smx
r = smx.Client(sys.argv[1]).check_profile(sys.argv[2])
assert r["ok"], r
assert len(r["warnings"]) == 1 and ".git/hooks" in r["warnings"][0], r
print("python ok")
`
	cmd := exec.CommandContext(ctx, py, "-c", script, sock, hooks)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(testutil.RepoRoot(), "python", "src"))
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "python ok") {
		t.Errorf("python check_profile: %v\n%s", err, out)
	}
}
