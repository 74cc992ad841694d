package bench

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/creack/pty"
)

// BenchmarkAgentRun compares `smx agent run claude` with `smx run --image
// <the same image> -- true` (its nearest peer: boot, one exec, teardown),
// with the claude preset's image built (scripts/test.sh builds it):
//
//   - run-true: the peer.
//   - agent-run-detached: create, boot, the preset's files copied in, the
//     agent started under its terminal holder; returns with it running.
//   - agent-run-to-prompt: `smx agent run claude` on a terminal until Claude
//     Code draws its prompt; and exec-claude-to-prompt: Claude Code started
//     in an already running sandbox of the same preset, to the same prompt,
//     which is the agent's own start-up (under TCG, most of the total).
func BenchmarkAgentRun(b *testing.B) {
	setup(b)
	img := presetImageBench(b, "claude")
	work := b.TempDir()
	// The model API must fail fast rather than hang on a name this offline
	// machine cannot resolve: the host-side hosts file points it at
	// loopback, which the gateway always refuses (a reset).
	hosts := filepath.Join(b.TempDir(), "hosts")
	os.WriteFile(hosts, []byte("127.0.0.1 api.anthropic.com statsig.anthropic.com\n"), 0o644)
	os.Setenv("SMX_HOSTS_FILE", hosts)
	defer os.Unsetenv("SMX_HOSTS_FILE")

	b.Run("run-true", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if out, err := smx("run", "--image", img, "--memory", "2G", "--", "true"); err != nil {
				b.Fatal(err, out)
			}
		}
	})
	b.Run("agent-run-detached", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			name := "bench-d" + strconv.Itoa(i)
			if out, err := smx("agent", "run", "claude", work, "-d", "--name", name); err != nil {
				b.Fatal(err, out)
			}
			b.StopTimer()
			smx("agent", "rm", "-f", name)
			b.StartTimer()
		}
	})
	b.Run("agent-run-to-prompt", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			name := "bench-p" + strconv.Itoa(i)
			toPrompt(b, "agent", "run", "claude", work, "--name", name)
			b.StopTimer()
			smx("agent", "rm", "-f", name)
			b.StartTimer()
		}
	})
	b.Run("exec-claude-to-prompt", func(b *testing.B) {
		b.StopTimer()
		// A detached agent that exits stops its sandbox (as a container
		// does), so the preset's own agent stays at its prompt, idle,
		// while a second Claude Code is timed beside it.
		if out, err := smx("agent", "run", "claude", work, "-d", "--name", "bench-x"); err != nil {
			b.Fatal(err, out)
		}
		defer smx("agent", "rm", "-f", "bench-x")
		toPrompt(b, "agent", "attach", "bench-x")
		b.StartTimer()
		for i := 0; i < b.N; i++ {
			toPrompt(b, "agent", "exec", "-it", "-u", "user", "-w", "/work", "bench-x", "--", "claude", "--dangerously-skip-permissions")
		}
	})
}

// toPrompt runs smx on a terminal until Claude Code's prompt character
// appears, then kills it.
func toPrompt(b *testing.B, args ...string) {
	b.Helper()
	cmd := exec.Command(filepath.Join(bin, "smx"), args...)
	cmd.Env = append(os.Environ(), "SMX_HOME="+home, "TERM=xterm-256color")
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait(); f.Close() }()
	found := make(chan error, 1)
	go func() {
		r := bufio.NewReader(f)
		var seen bytes.Buffer
		buf := make([]byte, 4096)
		for {
			n, err := r.Read(buf)
			seen.Write(buf[:n])
			if bytes.Contains(seen.Bytes(), []byte("❯")) {
				found <- nil
				return
			}
			if err != nil {
				found <- errors.New("no prompt before " + err.Error() + ":\n" + seen.String())
				io.Copy(io.Discard, r)
				return
			}
		}
	}()
	select {
	case err := <-found:
		if err != nil {
			b.Fatal(err)
		}
	case <-time.After(5 * time.Minute):
		b.Fatal("no prompt within 5 minutes")
	}
}
