package cli_test

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestAgentRunPlainOutput: `smx agent run ... > out.txt` (stdout not a
// terminal) gets the agent's plain output, as `docker run` without -t
// does: stdout and stderr apart, no terminal redraws, NUL or CRLF, stdin
// passed on when it is not a terminal, ARGS appended to the preset's
// command, and the agent's exit status (issue 31).
func TestAgentRunPlainOutput(t *testing.T) {
	bin, home := claudeStandIn(t, `command: [sh, -c, 'printf "out one\ntwo\n"; echo err line >&2; cat; echo "arg=$1"; exit 3', agent]`)

	v := &vmEnv{t: t, bin: bin, home: home, name: "plain"}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", v.name) })
	c := v.cmd("agent", "run", "claude", t.TempDir(), "--rm", "--name", v.name, "--memory", "512M", "--", "x y")
	c.Stdin = strings.NewReader("piped in\n")
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// On a terminal, the piped stdin would never end for cat.
	timer := time.AfterFunc(4*time.Minute, func() { c.Process.Kill() })
	err := c.Wait()
	if !timer.Stop() {
		t.Fatalf("agent run did not end in 4 minutes\nstdout: %q\nstderr:\n%s", stdout.String(), stderr.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("exit: %v, want status 3\nstderr:\n%s", err, stderr.String())
	}
	if want := "out one\ntwo\npiped in\narg=x y\n"; stdout.String() != want {
		t.Errorf("stdout = %q, want %q\nstderr:\n%s", stdout.String(), want, stderr.String())
	}
	if !strings.Contains(stderr.String(), "err line\n") || !strings.Contains(stderr.String(), "exited with status 3; sandbox plain removed") {
		t.Errorf("stderr:\n%s", stderr.String())
	}
	if strings.ContainsAny(stderr.String(), "\x00\x1b\r") {
		t.Errorf("stderr carries terminal bytes: %q", stderr.String())
	}
}
