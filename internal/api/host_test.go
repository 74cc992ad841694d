package api_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/testutil"
)

// TestHostAPI: the host checks and the kernel cache over the API, on a
// state directory without a kernel: doctor says what is missing and how
// to fix it; a kernel version that names a path outside the cache is
// refused, and nothing outside it is removed.
func TestHostAPI(t *testing.T) {
	bin := testutil.Binaries(t)
	home := t.TempDir()
	sock := filepath.Join(home, "api.sock")
	serve(t, bin, home, "--listen", "unix:"+sock)
	c, _ := checkedClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	rep, err := c.Doctor(ctx)
	if err != nil || rep.OK || rep.StateDir != home || rep.Accel == "" {
		t.Fatalf("doctor without a kernel: %v %+v", err, rep)
	}
	var kr *wire.Requirement
	for i, r := range rep.Requirements {
		if r.Name == "guest kernel" {
			kr = &rep.Requirements[i]
		}
	}
	if kr == nil || kr.Found || !strings.Contains(kr.Fix, "smx setup") {
		t.Errorf("doctor's guest kernel: %+v", kr)
	}

	if ks, err := c.Kernels(ctx); err != nil || ks == nil || len(ks) != 0 {
		t.Errorf("kernels of an empty cache: %v %+v", err, ks)
	}
	// A directory beside the cache, which a version of "../victim" would
	// name.
	victim := filepath.Join(home, "victim")
	os.MkdirAll(victim, 0o755)
	os.WriteFile(filepath.Join(victim, "vmlinuz"), []byte("x"), 0o644)
	err = c.RemoveKernel(ctx, ".hidden")
	wantClass(t, "rm kernel .hidden", err, 400, client.ErrInvalid)
	// Sent raw: the OpenAPI router reads the escaped slash as a path
	// separator and knows no such route.
	for _, p := range []string{"/v1/kernels/..%2Fvictim", "/v1/kernels/%2E%2E%2Fvictim"} {
		if code, body := raw(t, nil, sock, "DELETE", p, "", nil); code != 400 || !strings.Contains(body, `"invalid"`) {
			t.Errorf("DELETE %s: %d %s, want 400 invalid", p, code, body)
		}
	}
	if _, err := os.Stat(filepath.Join(victim, "vmlinuz")); err != nil {
		t.Errorf("a kernel removal reached outside the cache: %v", err)
	}
	_, err = c.BuildKernel(ctx, wire.KernelBuildRequest{Jobs: -2})
	wantClass(t, "build with -2 jobs", err, 400, client.ErrInvalid)
}

// TestTemplatesLogsAPI: boot templates and sandbox logs over the API, on a
// state directory without VMs: a removed sandbox's log is listed and
// pruned; a log name that is a path is refused and reaches nothing.
func TestTemplatesLogsAPI(t *testing.T) {
	bin := testutil.Binaries(t)
	home := t.TempDir()
	sock := filepath.Join(home, "api.sock")
	serve(t, bin, home, "--listen", "unix:"+sock)
	c, _ := checkedClient(t, sock)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if l, err := c.Templates(ctx); err != nil || l == nil || len(l) != 0 {
		t.Errorf("templates: %v %+v", err, l)
	}
	err := c.RemoveTemplate(ctx, "tpl-nosuch")
	wantClass(t, "rm a missing template", err, 404, client.ErrNotFound)

	// The log of a sandbox that is gone.
	os.MkdirAll(filepath.Join(home, "logs", "oldbox"), 0o700)
	os.WriteFile(filepath.Join(home, "logs", "oldbox", "records.jsonl"), nil, 0o600)
	victim := filepath.Join(home, "victim")
	os.MkdirAll(victim, 0o700)
	os.WriteFile(filepath.Join(victim, "records.jsonl"), nil, 0o600)
	if l, err := c.LogNames(ctx); err != nil || len(l) != 1 || l[0] != "oldbox" {
		t.Fatalf("logs: %v %+v", err, l)
	}
	_, err = c.PruneLogs(ctx, nil, false)
	wantClass(t, "prune nothing named", err, 400, client.ErrInvalid)
	_, err = c.PruneLogs(ctx, []string{"oldbox"}, true)
	wantClass(t, "prune names and all", err, 400, client.ErrInvalid)
	_, err = c.PruneLogs(ctx, []string{"../victim"}, false)
	wantClass(t, "prune a path", err, 400, client.ErrInvalid)
	if _, err := os.Stat(filepath.Join(victim, "records.jsonl")); err != nil {
		t.Errorf("a prune reached outside the logs: %v", err)
	}
	if done, err := c.PruneLogs(ctx, []string{"oldbox"}, false); err != nil || len(done) != 1 || done[0] != "oldbox" {
		t.Fatalf("prune: %v %v", err, done)
	}
	if l, err := c.LogNames(ctx); err != nil || len(l) != 0 {
		t.Errorf("logs after prune: %v %+v", err, l)
	}
}
