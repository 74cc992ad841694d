package cli_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rogpeppe/go-internal/testscript"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/testutil"
)

// vmHome is one state directory shared by the scripts of this test binary:
// the cached kernel linked in, the busybox image built once. Scripts use
// distinct sandbox names, which also exercises concurrent CLIs.
var (
	homeOnce sync.Once
	homeDir  string
	homeBin  string
	homeErr  error
)

func vmHome(t testing.TB, bin string) string {
	t.Helper()
	homeOnce.Do(func() {
		homeBin = bin
		kernels := testutil.KernelCache(t)
		homeDir, homeErr = os.MkdirTemp("", "smx-home-")
		if homeErr != nil {
			return
		}
		if homeErr = os.Symlink(kernels, filepath.Join(homeDir, "kernels")); homeErr != nil {
			return
		}
		cmd := exec.Command(filepath.Join(bin, "smx"), "image", "build", "busybox", "--from", "busybox")
		cmd.Env = append(os.Environ(), "SMX_HOME="+homeDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			homeErr = fmt.Errorf("build busybox image: %v\n%s", err, out)
		}
	})
	if homeErr != nil {
		t.Fatal(homeErr)
	}
	return homeDir
}

// TestMain removes every sandbox the tests left in the shared state
// directory, so no VM outlives the test binary.
func TestMain(m *testing.M) {
	code := m.Run()
	if homeDir != "" {
		cleanupSandboxes(homeBin, homeDir, "")
		os.RemoveAll(homeDir)
	}
	os.Exit(code)
}

// TestScripts drives the real smx binary, which boots real microVMs.
func TestScripts(t *testing.T) {
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	home := vmHome(t, bin)
	testscript.Run(t, testscript.Params{
		Dir: "testdata/script",
		Setup: func(env *testscript.Env) error {
			env.Setenv("PATH", bin+string(os.PathListSeparator)+env.Getenv("PATH"))
			env.Setenv("SMX_BIN_DIR", bin)
			if k, err := kernel.Find(filepath.Join(home, "kernels")); err == nil {
				env.Setenv("GUEST_KERNEL", k.Version)
			}
			env.Setenv("SMX_HOME", home)
			env.Setenv("SMX_KERNELS", filepath.Join(home, "kernels"))
			env.Setenv("HOST_KERNEL", hostKernel())
			// The QEMU the suite runs on (scripts/test.sh runs part of it
			// again on an older one) and a chosen file transport reach
			// the scripts' smx as they reach the Go-level tests'.
			for _, k := range []string{"SMX_QEMU", "SMX_FILES_TRANSPORT"} {
				if v := os.Getenv(k); v != "" {
					env.Setenv(k, v)
				}
			}
			// Log keys are pinned in the user's config: keep it per script.
			env.Setenv("XDG_CONFIG_HOME", filepath.Join(env.WorkDir, ".config"))
			// Sandboxes a failed script left running are removed.
			env.Defer(func() {
				if p := env.Getenv("SCRIPT_PREFIX"); p != "" {
					cleanupSandboxes(bin, home, p)
				}
				// Scripts with a state directory of their own keep it in
				// $WORK/home, which is deleted with $WORK: stop its VMs first.
				if _, err := os.Stat(filepath.Join(env.WorkDir, "home", "sandboxes")); err == nil {
					cleanupSandboxes(bin, filepath.Join(env.WorkDir, "home"), "")
				}
			})
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			"exitcode":       cmdExitCode,
			"waitfor":        cmdWaitFor,
			"killpid":        cmdKillPID,
			"pidgone":        cmdPIDGone,
			"sandboxprocess": cmdSandboxProcess,
			"httpserver":     cmdHTTPServer,
			"forgelog":       cmdForgeLog,
			"httpget":        cmdHTTPGet,  // port_script_test.go
			"freeport":       cmdFreePort, // port_script_test.go
		},
		RequireExplicitExec: true,
	})
}

func hostKernel() string {
	var u syscall.Utsname
	syscall.Uname(&u)
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

// cleanupSandboxes force-removes the sandboxes whose names start with
// prefix ("" = all).
func cleanupSandboxes(bin, home, prefix string) {
	ls := exec.Command(filepath.Join(bin, "smx"), "agent", "ls")
	ls.Env = append(os.Environ(), "SMX_HOME="+home)
	out, _ := ls.Output()
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(f[0], prefix) {
			c := exec.Command(filepath.Join(bin, "smx"), "agent", "rm", "-f", f[0])
			c.Env = append(os.Environ(), "SMX_HOME="+home)
			c.Run()
		}
	}
}

// exitcode N PROG ARGS... runs PROG and checks its exit code is N; its
// output lands in stdout/stderr like exec's.
func cmdExitCode(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: exitcode N prog args...")
	}
	want, err := strconv.Atoi(args[0])
	ts.Check(err)
	err = ts.Exec(args[1], args[2:]...)
	got := 0
	if ee, ok := err.(*exec.ExitError); ok {
		got = ee.ExitCode()
	} else if err != nil {
		ts.Fatalf("exec %s: %v", args[1], err)
	}
	if (got == want) == neg {
		ts.Fatalf("exit code %d, want %s%d", got, map[bool]string{true: "not ", false: ""}[neg], want)
	}
}

// waitfor SECONDS PROG ARGS... retries until PROG's stdout contains the
// last argument.
func cmdWaitFor(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 3 {
		ts.Fatalf("usage: waitfor SECONDS prog args... substring")
	}
	secs, err := strconv.Atoi(args[0])
	ts.Check(err)
	want := args[len(args)-1]
	deadline := time.Now().Add(time.Duration(secs) * time.Second)
	for {
		ts.Exec(args[1], args[2:len(args)-1]...)
		if strings.Contains(ts.ReadFile("stdout"), want) {
			return
		}
		if time.Now().After(deadline) {
			ts.Fatalf("after %ds, output of %s does not contain %q:\n%s", secs, args[1], want, ts.ReadFile("stdout"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sandboxprocess NAME supervisor|qemu VAR sets VAR to that PID, read from
// `smx agent inspect --json`.
func cmdSandboxProcess(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 3 {
		ts.Fatalf("usage: sandboxprocess NAME supervisor|qemu VAR")
	}
	ts.Check(ts.Exec("smx", "agent", "inspect", "--json", args[0]))
	out := ts.ReadFile("stdout")
	key := map[string]string{"supervisor": `"supervisor_pid": `, "qemu": `"qemu_pid": `}[args[1]]
	i := strings.Index(out, key)
	if i < 0 {
		ts.Fatalf("no %s pid in inspect output", args[1])
	}
	rest := out[i+len(key):]
	j := strings.IndexAny(rest, ",\n")
	ts.Setenv(args[2], strings.TrimSpace(rest[:j]))
}

// killpid PID sends SIGKILL.
func cmdKillPID(ts *testscript.TestScript, neg bool, args []string) {
	pid, err := strconv.Atoi(args[0])
	ts.Check(err)
	ts.Check(syscall.Kill(pid, syscall.SIGKILL))
}

// pidgone SECONDS PID waits until the process has died (a zombie waiting
// for its reaper counts as dead).
func cmdPIDGone(ts *testscript.TestScript, neg bool, args []string) {
	secs, err := strconv.Atoi(args[0])
	ts.Check(err)
	pid, err := strconv.Atoi(args[1])
	ts.Check(err)
	deadline := time.Now().Add(time.Duration(secs) * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			ts.Fatalf("process %d still exists after %ds", pid, secs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// httpserver VAR starts an HTTP server on host loopback for the rest of
// the script and sets VAR to its port. "/" answers "hello from host";
// "/slow" streams a line every 100 ms until a write fails.
func cmdHTTPServer(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) != 1 {
		ts.Fatalf("usage: httpserver VAR")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello from host") })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "tick %d\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			// Not r.Context(): nc half-closes after sending the request,
			// which the server takes for the client going away.
			time.Sleep(100 * time.Millisecond)
		}
	})
	srv := httptest.NewServer(mux)
	ts.Defer(srv.Close)
	_, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	ts.Setenv(args[0], port)
}

// forgelog DIR KIND... appends records to the log in DIR as someone who can
// write the file but not sign would: seq, prev and hash computed exactly as
// smx does (an independent implementation of the documented format).
func cmdForgeLog(ts *testscript.TestScript, neg bool, args []string) {
	if len(args) < 2 {
		ts.Fatalf("usage: forgelog DIR KIND...")
	}
	path := filepath.Join(ts.MkAbs(args[0]), "records.jsonl")
	lines := strings.Split(strings.TrimSpace(ts.ReadFile(path)), "\n")
	var last struct {
		Seq     int64     `json:"seq"`
		Time    time.Time `json:"time"`
		Sandbox string    `json:"sandbox"`
		Hash    string    `json:"hash"`
	}
	ts.Check(json.Unmarshal([]byte(lines[len(lines)-1]), &last))
	prev, seq := last.Hash, last.Seq+1
	var out strings.Builder
	for _, kind := range args[1:] {
		body := fmt.Sprintf(`{"seq":%d,"time":%q,"sandbox":%q,"kind":%q,"fields":{"args":["curl","evil.example"]},"prev":%q`,
			seq, last.Time.Add(time.Second).Format(time.RFC3339Nano), last.Sandbox, kind, prev)
		h := tlog.RecordHash([]byte("smx-audit-record/v1\n" + body + "}"))
		prev = base64.StdEncoding.EncodeToString(h[:])
		fmt.Fprintf(&out, "%s,\"hash\":%q}\n", body, prev)
		seq++
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	ts.Check(err)
	_, err = f.WriteString(out.String())
	ts.Check(err)
	ts.Check(f.Close())
}
