package cli_test

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAgentAttachDetach: an agent started with `smx agent run -d` keeps
// running with nobody attached; `smx agent attach` reaches it, the detach
// keys leave it running, and a later attach sees it end with its own exit
// status. The agent is a user's preset (same recipe as claude, so the same
// image) whose command echoes what it reads.
func TestAgentAttachDetach(t *testing.T) {
	bin, home := claudeStandIn(t, `command: [sh, -c, 'while read l; do echo "GOT:$l"; [ "$l" = quit ] && exit 7; done']`)

	v := &vmEnv{t: t, bin: bin, home: home, name: "attach"}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", v.name) })
	out, err := v.smx("agent", "run", "claude", t.TempDir(), "-d", "--name", v.name, "--memory", "512M")
	if err != nil || strings.TrimSpace(lastLine(out)) != v.name {
		t.Fatalf("run -d: %v\n%s", err, out)
	}

	attach := func(extra ...string) (*exec.Cmd, io.WriteCloser, *syncBuffer) {
		c := v.cmd(append([]string{"agent", "attach", v.name}, extra...)...)
		in, err := c.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var buf syncBuffer
		c.Stdout, c.Stderr = &buf, &buf
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return c, in, &buf
	}
	waitFor := func(buf *syncBuffer, s string) {
		t.Helper()
		for end := time.Now().Add(90 * time.Second); !strings.Contains(buf.String(), s); {
			if time.Now().After(end) {
				t.Fatalf("no %q in:\n%s", s, buf.String())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Detach with the default keys: attach ends with 0, the agent lives.
	c, in, buf := attach()
	io.WriteString(in, "hello\n")
	waitFor(buf, "GOT:hello")
	io.WriteString(in, "\x10\x11")
	if err := c.Wait(); err != nil || !strings.Contains(buf.String(), "detached from "+v.name) {
		t.Fatalf("detach: %v\n%s", err, buf.String())
	}
	if out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", "test -S /tmp/.smx-agent.sock && pgrep -f '[w]hile read l' >/dev/null && echo ALIVE"); err != nil || !strings.Contains(out, "ALIVE") {
		t.Fatalf("the agent did not survive the detach: %v\n%s", err, out)
	}
	ls, _ := v.smx("agent", "ls")
	if !strings.Contains(ls, "PRESET") || !strings.Contains(ls, " claude ") || !strings.Contains(ls, "claude (preset)") {
		t.Errorf("agent ls:\n%s", ls)
	}

	// Other detach keys; a ctrl-p alone reaches the agent.
	c, in, buf = attach("--detach-keys", "ctrl-a,d")
	io.WriteString(in, "again\n")
	waitFor(buf, "GOT:again")
	io.WriteString(in, "\x01d")
	if err := c.Wait(); err != nil || !strings.Contains(buf.String(), "detached") {
		t.Fatalf("detach with ctrl-a,d: %v\n%s", err, buf.String())
	}

	// The agent ends: attach exits with its status.
	c, in, buf = attach()
	io.WriteString(in, "quit\n")
	err = c.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("attach to an agent that exits 7: %v\n%s", err, buf.String())
	}
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndex(s, "\n")+1:]
}
