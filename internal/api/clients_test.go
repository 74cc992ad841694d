package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/testutil"
)

// chunkRecorder records each write and when it came.
type chunkRecorder struct {
	chunks []string
	when   []time.Time
}

func (c *chunkRecorder) Write(p []byte) (int, error) {
	c.chunks = append(c.chunks, string(p))
	c.when = append(c.when, time.Now())
	return len(p), nil
}

// TestClientScenarios runs one scenario through the Go client and through
// the Python package (installed with pip, offline, into a fresh venv), both
// against a real `smx serve` with real VMs: create, exec with streamed
// output, cp, snapshot, fork, logs --verify, rm.
func TestClientScenarios(t *testing.T) {
	_, _, sock := vmServer(t)

	t.Run("go", func(t *testing.T) {
		c := client.New(sock)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		const name, snap, fork = "goscn", "goscn-snap", "goscn-fork"
		defer func() {
			c.Remove(context.Background(), fork, true)
			c.Remove(context.Background(), name, true)
			c.RemoveSnapshot(context.Background(), snap)
		}()
		sb, err := c.Create(ctx, client.CreateRequest{Name: name, Memory: "256M", Start: true})
		if err != nil || sb.Status != "running" {
			t.Fatalf("create: %v %+v", err, sb)
		}
		var out chunkRecorder
		var errb bytes.Buffer
		st, err := c.Exec(ctx, name, client.ExecRequest{Args: []string{"sh", "-c", "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo err >&2; exit 4"}},
			client.ExecIO{Stdout: &out, Stderr: &errb})
		if err != nil || st.Code != 4 || strings.Join(out.chunks, "") != "line1\nline2\nline3\n" || errb.String() != "err\n" {
			t.Fatalf("exec: %v %+v %q %q", err, st, out.chunks, errb.String())
		}
		if len(out.chunks) < 3 || out.when[len(out.when)-1].Sub(out.when[0]) < 400*time.Millisecond {
			t.Errorf("output was not streamed: %q", out.chunks)
		}
		if _, err := c.CopyIn(ctx, name, "/tmp", mustTar(t, "go-file.txt", "from go\n")); err != nil {
			t.Fatal(err)
		}
		rc, err := c.CopyOut(ctx, name, "/tmp/go-file.txt")
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		if h, err := tr.Next(); err != nil || h.Name != "go-file.txt" {
			t.Fatalf("copy out: %v", err)
		}
		if b, _ := io.ReadAll(tr); string(b) != "from go\n" {
			t.Errorf("copy out: %q", b)
		}
		rc.Close()
		if _, err := c.Snapshot(ctx, name, client.SnapshotRequest{Name: snap}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Fork(ctx, snap, client.ForkRequest{Name: fork}); err != nil {
			t.Fatal(err)
		}
		if r, err := c.Run(ctx, fork, client.ExecRequest{Args: []string{"cat", "/tmp/go-file.txt"}}); err != nil || r.Stdout != "from go\n" {
			t.Errorf("fork: %v %+v", err, r)
		}
		var kinds []string
		c.Logs(ctx, name, client.LogOptions{}, func(r client.Record) error { kinds = append(kinds, r.Kind); return nil })
		for _, k := range []string{"sandbox.create", "exec.start", "snapshot.create"} {
			if !slices.Contains(kinds, k) {
				t.Errorf("log has no %s: %v", k, kinds)
			}
		}
		if rep, err := c.VerifyLog(ctx, name); err != nil || !rep.OK {
			t.Errorf("verify: %v %+v", err, rep)
		}
		for _, n := range []string{fork, name} {
			if err := c.Remove(ctx, n, true); err != nil {
				t.Error(err)
			}
		}
		if err := c.RemoveSnapshot(ctx, snap); err != nil {
			t.Error(err)
		}
		if _, err := c.Inspect(ctx, name); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("after rm: %v", err)
		}
	})

	t.Run("python", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		testutil.Require(t, err == nil, "python3", "apt-get install python3 python3-venv python3-pip (scripts/test.sh does)")
		venv := filepath.Join(t.TempDir(), "venv")
		if out, err := exec.Command(py, "-m", "venv", venv).CombinedOutput(); err != nil {
			testutil.Require(t, false, "python3 -m venv", "apt-get install python3-venv: "+string(out))
		}
		// Offline: the package builds with its in-tree backend and has no
		// dependencies.
		pip := exec.Command(filepath.Join(venv, "bin", "python"), "-m", "pip", "install", "--no-index", "--quiet",
			filepath.Join(testutil.RepoRoot(), "python"))
		pip.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_INPUT=1")
		if out, err := pip.CombinedOutput(); err != nil {
			t.Fatalf("pip install ./python: %v\n%s", err, out)
		}
		cmd := exec.Command(filepath.Join(venv, "bin", "python"), filepath.Join(testutil.RepoRoot(), "python", "tests", "scenario.py"), sock, "pyscn")
		cmd.Dir = t.TempDir() // import smx from the venv, not the source tree
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "scenario ok") {
			t.Fatalf("python scenario: %v\n%s", err, out)
		}
	})
}

// TestPythonTypes: the Python package type-checks under mypy --strict, and
// the scenario (a user's code) type-checks against it.
func TestPythonTypes(t *testing.T) {
	var py string
	for _, c := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(c, "-m", "mypy", "--version").Run() == nil {
			py = c
			break
		}
	}
	testutil.Require(t, py != "", "mypy", "apt-get install python3-mypy (scripts/test.sh does)")
	dir := filepath.Join(testutil.RepoRoot(), "python")
	for _, args := range [][]string{{"--strict", "src/smx"}, {"tests/scenario.py"}, {"tests/agent_scenario.py"}} {
		cmd := exec.Command(py, append([]string{"-m", "mypy", "--no-incremental", "--cache-dir=/dev/null"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "MYPYPATH="+filepath.Join(dir, "src"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("mypy %v: %v\n%s", args, err, out)
		}
	}
}
