package guest

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/agentproto"
)

func TestExecExitCode(t *testing.T) {
	sess := startServer(t)
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"sh", "-c", "exit 3"}}, nil)
	mustExit(t, r, 3)
	if !r.Started || r.PID <= 0 {
		t.Errorf("no FrameStarted with a pid: %+v", r)
	}
}

func TestExecKilledBySignal(t *testing.T) {
	sess := startServer(t)
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"sh", "-c", "kill -9 $$"}}, nil)
	mustExit(t, r, 128+9)
	if r.Exit.Signal != 9 {
		t.Errorf("signal = %d, want 9", r.Exit.Signal)
	}
}

func TestExecSignalFrame(t *testing.T) {
	sess := startServer(t)
	req := agentproto.ExecRequest{Args: []string{"sh", "-c", "echo ready; sleep 100"}}
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpExec, Exec: &req})
	defer st.Close()
	var once sync.Once
	r := readExec(t, st, nil, func(out string) {
		if strings.Contains(out, "ready") {
			once.Do(func() {
				if err := agentproto.WriteJSON(st, agentproto.FrameSignal, agentproto.Signal{Signal: int(unix.SIGTERM)}); err != nil {
					t.Error(err)
				}
			})
		}
	})
	mustExit(t, r, 128+15)
}

func TestExecStdoutStderr(t *testing.T) {
	sess := startServer(t)
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"sh", "-c", "echo out; echo err >&2; echo out2"}}, nil)
	mustExit(t, r, 0)
	if got := r.Stdout.String(); got != "out\nout2\n" {
		t.Errorf("stdout = %q", got)
	}
	if got := r.Stderr.String(); got != "err\n" {
		t.Errorf("stderr = %q", got)
	}
}

func TestExecStdinEcho(t *testing.T) {
	sess := startServer(t)
	in := bytes.Repeat([]byte("hello stdin\n"), 50000) // 600 kB, more than a pipe holds
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"cat"}}, in)
	mustExit(t, r, 0)
	if !bytes.Equal(r.Stdout.Bytes(), in) {
		t.Errorf("cat echoed %d bytes, want %d", r.Stdout.Len(), len(in))
	}
}

func TestExecNoStdinIsDevNull(t *testing.T) {
	sess := startServer(t)
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"cat"}}, nil)
	mustExit(t, r, 0)
	if r.Stdout.Len() != 0 {
		t.Errorf("stdout = %q", r.Stdout.String())
	}
}

func TestExecLargeOutput(t *testing.T) {
	sess := startServer(t)
	const n = 24 << 20
	req := agentproto.ExecRequest{Args: []string{"head", "-c", "25165824", "/dev/zero"}}
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpExec, Exec: &req})
	defer st.Close()
	var total int
	start := time.Now()
	for {
		typ, p, err := agentproto.ReadFrame(st, nil)
		if err != nil {
			t.Fatal(err)
		}
		if typ == agentproto.FrameStdout {
			total += len(p)
			continue
		}
		if typ == agentproto.FrameExit {
			break
		}
		if typ == agentproto.FrameError {
			t.Fatal(agentproto.DecodeError(p))
		}
	}
	if total != n {
		t.Errorf("got %d bytes, want %d", total, n)
	}
	t.Logf("%d MiB in %v", n>>20, time.Since(start))
}

func TestExecTTY(t *testing.T) {
	sess := startServer(t)
	req := agentproto.ExecRequest{
		Args: []string{"sh", "-c", `tty; stty size; echo "TERM=$TERM"; read x; stty size; echo "got $x"`},
		TTY:  true,
		Size: &agentproto.WindowSize{Rows: 30, Cols: 100},
	}
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpExec, Exec: &req})
	defer st.Close()
	var once sync.Once
	r := readExec(t, st, nil, func(out string) {
		if strings.Contains(out, "TERM=") {
			once.Do(func() {
				if err := agentproto.WriteJSON(st, agentproto.FrameResize, agentproto.WindowSize{Rows: 40, Cols: 120}); err != nil {
					t.Error(err)
				}
				if err := agentproto.WriteFrame(st, agentproto.FrameStdin, []byte("line\n")); err != nil {
					t.Error(err)
				}
			})
		}
	})
	mustExit(t, r, 0)
	out := strings.ReplaceAll(r.Stdout.String(), "\r\n", "\n")
	for _, want := range []string{"30 100\n", "40 120\n", "TERM=xterm\n", "got line\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^/dev/pts/\d+$`).MatchString(out) {
		t.Errorf("tty did not print /dev/pts/N:\n%s", out)
	}
	if r.Stderr.Len() != 0 {
		t.Errorf("stderr with a tty: %q", r.Stderr.String())
	}
}

func TestExecTTYStdinEOF(t *testing.T) {
	sess := startServer(t)
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"cat"}, TTY: true}, []byte("abc\n"))
	mustExit(t, r, 0)
	if !strings.Contains(r.Stdout.String(), "abc") {
		t.Errorf("stdout = %q", r.Stdout.String())
	}
}

func TestExecEnvAndDir(t *testing.T) {
	sess := startServer(t)
	dir := t.TempDir()
	r := run(t, sess, agentproto.ExecRequest{
		Args: []string{"sh", "-c", `echo "$FOO|$PATH|$HOME"; pwd`},
		Env:  []string{"FOO=bar"},
		Dir:  dir,
	}, nil)
	mustExit(t, r, 0)
	lines := strings.Split(strings.TrimSpace(r.Stdout.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("stdout = %q", r.Stdout.String())
	}
	f := strings.Split(lines[0], "|")
	if f[0] != "bar" || f[1] != DefaultPath || f[2] == "" {
		t.Errorf("env = %q", lines[0])
	}
	if real, _ := filepath.EvalSymlinks(dir); lines[1] != dir && lines[1] != real {
		t.Errorf("pwd = %q, want %q", lines[1], dir)
	}
}

// The executable is looked up in the process's PATH, not the agent's.
func TestExecLookupUsesRequestPath(t *testing.T) {
	sess := startServer(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "only-here")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho found\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"only-here"}, Env: []string{"PATH=" + dir + ":/usr/bin:/bin"}}, nil)
	mustExit(t, r, 0)
	if r.Stdout.String() != "found\n" {
		t.Errorf("stdout = %q", r.Stdout.String())
	}
}

func TestExecNotFound(t *testing.T) {
	sess := startServer(t)
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"no-such-program-smx"}}, nil)
	if r.Started || r.Exit != nil {
		t.Fatalf("process reported as started: %+v", r)
	}
	want := `exec: "no-such-program-smx": executable file not found in $PATH`
	if r.Err == nil || r.Err.Error() != want {
		t.Fatalf("error = %v, want %q", r.Err, want)
	}
}

func TestExecBadDir(t *testing.T) {
	sess := startServer(t)
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"true"}, Dir: "/no/such/dir"}, nil)
	if r.Err == nil || !strings.Contains(r.Err.Error(), "working directory") {
		t.Fatalf("error = %v", r.Err)
	}
}

func TestExecNumericUser(t *testing.T) {
	requireRoot(t)
	sess := startServer(t)
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"sh", "-c", "id -u; id -g; id -G; echo $HOME"}, User: "4321:77"}, nil)
	mustExit(t, r, 0)
	if got := r.Stdout.String(); got != "4321\n77\n77\n/\n" {
		t.Errorf("id output = %q", got)
	}
}

func TestExecNamedUser(t *testing.T) {
	requireRoot(t)
	etc := t.TempDir()
	// Not t.TempDir: its parent is 0700, so alice could not chdir into it.
	home, err := os.MkdirTemp("", "smx-home")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	writeFile(t, filepath.Join(etc, "passwd"), "root:x:0:0:root:/root:/bin/sh\nalice:x:1500:1600:Alice:"+home+":/bin/sh\n")
	writeFile(t, filepath.Join(etc, "group"), "root:x:0:\nalice:x:1600:\ndev:x:1700:bob,alice\nother:x:1800:bob\n")
	if err := os.Chmod(home, 0o755); err != nil {
		t.Fatal(err)
	}
	sess := startServer(t, func(s *Server) {
		s.PasswdPath = filepath.Join(etc, "passwd")
		s.GroupPath = filepath.Join(etc, "group")
	})
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"sh", "-c", "id -u; id -g; id -G; echo $HOME $USER; pwd"}, User: "alice"}, nil)
	mustExit(t, r, 0)
	want := "1500\n1600\n1600 1700\n" + home + " alice\n" + home + "\n"
	if got := r.Stdout.String(); got != want {
		t.Errorf("output = %q, want %q", got, want)
	}

	r = run(t, sess, agentproto.ExecRequest{Args: []string{"true"}, User: "mallory"}, nil)
	if r.Err == nil || !strings.Contains(r.Err.Error(), `"mallory"`) || r.Started {
		t.Errorf("unknown user: %+v", r)
	}
}

// When the host goes away, the process group must not linger.
func TestExecHostGoneKillsProcess(t *testing.T) {
	sess := startServer(t)
	req := agentproto.ExecRequest{Args: []string{"sleep", "100"}}
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpExec, Exec: &req})
	typ, p, err := agentproto.ReadFrame(st, nil)
	if err != nil || typ != agentproto.FrameStarted {
		t.Fatalf("frame %s %q %v", typ, p, err)
	}
	r := readStarted(t, p)
	st.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		// Once reaped the pid is gone; a zombie still has a /proc entry.
		if _, err := os.Stat("/proc/" + strconv.Itoa(r) + "/stat"); errors.Is(err, os.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive after the host closed the stream", r)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A background child holding stdout open must not hold the exit back.
func TestExecBackgroundChildDoesNotBlockExit(t *testing.T) {
	sess := startServer(t)
	start := time.Now()
	r := run(t, sess, agentproto.ExecRequest{Args: []string{"sh", "-c", "echo before; sleep 30 & echo after"}}, nil)
	mustExit(t, r, 0)
	if got := r.Stdout.String(); got != "before\nafter\n" {
		t.Errorf("stdout = %q", got)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("exit took %v", d)
	}
}

func TestExecConcurrent(t *testing.T) {
	sess := startServer(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := sess.OpenStream()
			if err != nil {
				t.Error(err)
				return
			}
			defer st.Close()
			req := agentproto.ExecRequest{Args: []string{"sh", "-c", "head -c 1000000 /dev/zero; exit 5"}}
			if err := agentproto.WriteJSON(st, agentproto.FrameRequest, agentproto.Request{Op: agentproto.OpExec, Exec: &req}); err != nil {
				t.Error(err)
				return
			}
			n := 0
			for {
				typ, p, err := agentproto.ReadFrame(st, nil)
				if err != nil {
					t.Error(err)
					return
				}
				switch typ {
				case agentproto.FrameStdout:
					n += len(p)
				case agentproto.FrameExit:
					if n != 1000000 || !strings.Contains(string(p), `"code":5`) {
						t.Errorf("n=%d exit=%s", n, p)
					}
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestHealth(t *testing.T) {
	sess := startServer(t)
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpHealth})
	defer st.Close()
	res, err := result(t, st)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK || !strings.HasPrefix(res.Kernel, "Linux version") || res.Uptime <= 0 || res.Hostname == "" {
		t.Errorf("health = %+v", res)
	}
}

func TestPowerOffRefusedWhenNotInit(t *testing.T) {
	sess := startServer(t)
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpPowerOff})
	defer st.Close()
	if _, err := result(t, st); err == nil || !strings.Contains(err.Error(), "not running as init") {
		t.Errorf("err = %v", err)
	}
}

func TestUnknownOp(t *testing.T) {
	sess := startServer(t)
	st := openRequest(t, sess, agentproto.Request{Op: "frobnicate"})
	defer st.Close()
	if _, err := result(t, st); err == nil || !strings.Contains(err.Error(), "frobnicate") {
		t.Errorf("err = %v", err)
	}
	if _, _, err := agentproto.ReadFrame(st, nil); !errors.Is(err, io.EOF) {
		t.Errorf("stream not closed after the error: %v", err)
	}
}

func readStarted(t *testing.T, p []byte) int {
	t.Helper()
	var s agentproto.Started
	if err := json.Unmarshal(p, &s); err != nil {
		t.Fatal(err)
	}
	return s.PID
}

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// An exec with Root runs chrooted into it: the user, PATH and working
// directory are the root's, the guest's /proc is mounted there, and the
// rlimits are set. Needs root (chroot, mount), as smx-agent has in the
// guest.
func TestExecRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chroot and mount need root")
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("no static /bin/busybox (apt-get install busybox-static)")
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "etc", "proc", "sys", "dev", "home/app"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, d := range []string{"proc", "sys", "dev"} {
			unix.Unmount(filepath.Join(root, d), unix.MNT_DETACH)
		}
	})
	files := map[string]string{
		"bin/busybox": string(bb), "marker": "in-root\n",
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home/app:/bin/sh\n",
	}
	for p, c := range files {
		if err := os.WriteFile(filepath.Join(root, p), []byte(c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range []string{"sh", "cat", "pwd", "id"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	sess := startServer(t)
	r := run(t, sess, agentproto.ExecRequest{
		Args: []string{"sh", "-c", `cat /marker; pwd; id -u; echo $HOME; test -r /proc/self/status && echo proc`},
		Env:  []string{"PATH=/bin"}, User: "app", Root: root,
	}, nil)
	mustExit(t, r, 0)
	if want := "in-root\n/home/app\n1234\n/home/app\nproc\n"; r.Stdout.String() != want {
		t.Fatalf("stdout %q, want %q (stderr %q)", r.Stdout.String(), want, r.Stderr.String())
	}
	// rlimits are set just after the start (see exec): the shell waits
	// for them, a bounded number of rounds. (As root: on a host without
	// CAP_SYS_RESOURCE, only a process of one's own uid can be limited.)
	r = run(t, sess, agentproto.ExecRequest{
		Args: []string{"sh", "-c", `i=0; while [ "$(ulimit -n)" != 123 ] && [ $i -lt 2000 ]; do i=$((i+1)); done; ulimit -n`},
		Env:  []string{"PATH=/bin"}, Root: root,
		Rlimits: []agentproto.Rlimit{{Resource: unix.RLIMIT_NOFILE, Soft: 123, Hard: 456}},
	}, nil)
	mustExit(t, r, 0)
	if r.Stdout.String() != "123\n" {
		t.Fatalf("ulimit -n: %q, want 123 (stderr %q)", r.Stdout.String(), r.Stderr.String())
	}
	// The command is looked up in the root: the host's /bin/true is not.
	if r := run(t, sess, agentproto.ExecRequest{Args: []string{"/bin/true"}, Root: root}, nil); r.Err == nil {
		t.Fatalf("/bin/true ran in a root without it: %+v", r.Exit)
	}
	// Three processes in one root: the mounts are made once.
	m, _ := os.ReadFile("/proc/self/mountinfo")
	if n := strings.Count(string(m), filepath.Join(root, "proc")+" "); n != 1 {
		t.Fatalf("%s mounted %d times", filepath.Join(root, "proc"), n)
	}
}
