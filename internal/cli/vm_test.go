package cli_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/testutil"
)

// vmEnv is one started sandbox for a Go-level test.
type vmEnv struct {
	t    *testing.T
	bin  string
	home string
	name string
	// ns, when set, is the network namespace the CLI runs in, and with it
	// every supervisor and QEMU it starts: a host of its own.
	ns *testutil.NetNS
}

func startSandbox(t *testing.T, name string, extra ...string) *vmEnv {
	t.Helper()
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	v := &vmEnv{t: t, bin: bin, home: vmHome(t, bin), name: name}
	v.smx("agent", "rm", "-f", name) // leftovers of an aborted run
	if out, err := v.smx(append([]string{"agent", "create", name}, extra...)...); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", name) })
	if out, err := v.smx("agent", "start", name); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	return v
}

func (v *vmEnv) cmd(args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(v.bin, "smx"), args...)
	if v.ns != nil {
		c = v.ns.Command(filepath.Join(v.bin, "smx"), args...)
	}
	// Log keys are pinned in the user's config: keep the tests' pins
	// with their state directory.
	c.Env = append(os.Environ(), "SMX_HOME="+v.home, "XDG_CONFIG_HOME="+filepath.Join(v.home, ".config"))
	return c
}

func (v *vmEnv) smx(args ...string) (string, error) {
	out, err := v.cmd(args...).CombinedOutput()
	return string(out), err
}

// setCred stores value on the host as credential name (`smx creds set`,
// the value on stdin).
func (v *vmEnv) setCred(name, value string) {
	v.t.Helper()
	set := v.cmd("creds", "set", name)
	set.Stdin = strings.NewReader(value)
	if out, err := set.CombinedOutput(); err != nil {
		v.t.Fatalf("creds set: %v\n%s", err, out)
	}
}

// newForgeVM is a host state directory with the Debian image, for a
// sandbox called name that works on a real forge: forge.test (git
// http-backend behind HTTPS and basic auth with token, served on
// ip:8443 of h; NetHost's own HTTPS server holds 443 on every address,
// and the gateway takes a forge's TLS on any port), whose token the host
// holds as credential forge-token. The forge has no repositories yet.
func newForgeVM(t *testing.T, h *testutil.NetHost, ip, token, name string) (v *vmEnv, forge *testutil.GitForge, image string) {
	t.Helper()
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	forge = testutil.NewGitForge(t, "forge.test", token)
	forge.Serve(t, h.Listen(t, "tcp4", ip+":8443"))
	home := t.TempDir()
	os.Symlink(testutil.KernelCache(t), filepath.Join(home, "kernels"))
	image = testutil.DebianImage(t, home)
	v = &vmEnv{t: t, bin: bin, home: home, name: name}
	v.setCred("forge-token", token)
	return v, forge, image
}

// createStart creates sandbox name from image under profile with 512M of
// memory and the further create flags extra, and starts it with env
// added to the host side's (a hosts file, a CA to trust); it is removed
// when the test ends.
func (v *vmEnv) createStart(name, image, profile string, env []string, extra ...string) {
	v.t.Helper()
	args := append([]string{"agent", "create", name, "--image", image, "--memory", "512M", "--profile", profile}, extra...)
	if out, err := v.smx(args...); err != nil {
		v.t.Fatalf("create %s: %v\n%s", name, err, out)
	}
	v.t.Cleanup(func() { v.smx("agent", "rm", "-f", name) })
	start := v.cmd("agent", "start", name)
	start.Env = append(start.Env, env...)
	if out, err := start.CombinedOutput(); err != nil {
		v.t.Fatalf("start %s: %v\n%s", name, err, out)
	}
}

// pending is the questions `smx approvals --json` lists as waiting.
func (v *vmEnv) pending(t *testing.T) []wire.Approval {
	t.Helper()
	out, err := v.cmd("approvals", "--json").Output()
	if err != nil {
		t.Fatalf("smx approvals: %v", err)
	}
	var l wire.Approvals
	if err := json.Unmarshal(out, &l); err != nil {
		t.Fatalf("smx approvals --json: %v\n%s", err, out)
	}
	return l.Approvals
}

// TestExecStream100MB pushes 100 MB through exec in each direction and
// checks every byte arrived.
func TestExecStream100MB(t *testing.T) {
	v := startSandbox(t, "stream")
	const n = 100 << 20

	// Guest → host.
	// Random data is slow to make under TCG: repeat 1 MiB of it.
	script := fmt.Sprintf(`head -c 1048576 /dev/urandom > /tmp/r; i=0; while [ $i -lt %d ]; do cat /tmp/r; i=$((i+1)); done > /tmp/blob; sha256sum /tmp/blob >&2; cat /tmp/blob`, n>>20)
	c := v.cmd("agent", "exec", v.name, "--", "sh", "-c", script)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	h := sha256.New()
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	got, _ := io.Copy(h, out)
	if err := c.Wait(); err != nil {
		t.Fatalf("exec: %v\n%s", err, stderr.String())
	}
	if got != n {
		t.Fatalf("stdout carried %d bytes, want %d", got, n)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); !strings.HasPrefix(stderr.String(), sum) {
		t.Fatalf("stdout sha256 %s, guest says %q", sum, stderr.String())
	}

	// Host → guest through stdin.
	data := make([]byte, n)
	rand.Read(data)
	sum := sha256.Sum256(data)
	c = v.cmd("agent", "exec", "-i", v.name, "--", "sha256sum")
	c.Stdin = bytes.NewReader(data)
	o, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("exec: %v\n%s", err, o)
	}
	if !strings.HasPrefix(string(o), hex.EncodeToString(sum[:])) {
		t.Fatalf("guest sha256 of stdin = %q, want %x", o, sum)
	}
}

// TestInterruptReachesGuest checks that Ctrl-C (SIGINT to the CLI) is
// delivered to the guest process, which decides what to do with it.
func TestInterruptReachesGuest(t *testing.T) {
	v := startSandbox(t, "sigint")
	c := v.cmd("agent", "exec", v.name, "--", "sh", "-c", `trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.1; done`)
	var out bytes.Buffer
	pr, pw := io.Pipe()
	c.Stdout = io.MultiWriter(&out, pw)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 64)
		var seen string
		for {
			n, err := pr.Read(buf)
			seen += string(buf[:n])
			if strings.Contains(seen, "ready") {
				close(ready)
				io.Copy(io.Discard, pr)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(60 * time.Second):
		c.Process.Kill()
		t.Fatal("guest command never became ready")
	}
	c.Process.Signal(syscall.SIGINT)
	err := c.Wait()
	pw.Close()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 7 {
		t.Fatalf("exit = %v, want code 7 from the guest's trap; output %q", err, out.String())
	}
	if !strings.Contains(out.String(), "got-int") {
		t.Fatalf("guest trap did not run: %q", out.String())
	}
}

// TestPTY drives `smx agent exec -it` in a real terminal (tmux): the guest
// sees a tty of the right size, follows a resize, and Ctrl-C typed at the
// keyboard interrupts the guest process.
func TestPTY(t *testing.T) {
	_, err := exec.LookPath("tmux")
	testutil.Require(t, err == nil, "tmux", "apt-get install tmux")
	v := startSandbox(t, "pty")
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	tmux := func(args ...string) string {
		out, err := exec.Command("tmux", append([]string{"-S", sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("tmux %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	shell := fmt.Sprintf("SMX_HOME=%s %s agent exec -it %s -- sh", v.home, filepath.Join(v.bin, "smx"), v.name)
	tmux("new-session", "-d", "-x", "100", "-y", "30", shell)
	defer exec.Command("tmux", "-S", sock, "kill-server").Run()
	waitScreen := func(want string) string {
		deadline := time.Now().Add(60 * time.Second)
		for {
			s := tmux("capture-pane", "-p")
			if strings.Contains(s, want) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("screen never showed %q:\n%s", want, s)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	tmux("send-keys", "echo tty=$(tty)", "Enter")
	waitScreen("tty=/dev/pts/")
	tmux("send-keys", "echo size=$(stty size)", "Enter")
	waitScreen("size=30 100")
	tmux("resize-window", "-x", "120", "-y", "40")
	time.Sleep(500 * time.Millisecond)
	tmux("send-keys", "echo size=$(stty size)", "Enter")
	waitScreen("size=40 120")
	tmux("send-keys", "sleep 1000", "Enter")
	time.Sleep(time.Second)
	tmux("send-keys", "C-c")
	tmux("send-keys", "echo after-sleep=$?", "Enter")
	waitScreen("after-sleep=130")
	tmux("send-keys", "exit", "Enter")
}

// TestTwoSandboxesAtOnce runs two sandboxes side by side: separate
// kernels, hostnames and disks.
func TestTwoSandboxesAtOnce(t *testing.T) {
	testutil.RequireQEMU(t)
	var wg sync.WaitGroup
	envs := make([]*vmEnv, 2)
	for i := range envs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			envs[i] = startSandbox(t, fmt.Sprintf("twin-%d", i))
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, v := range envs {
		if out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", "echo "+v.name+" > /root/who"); err != nil {
			t.Fatal(err, out)
		}
	}
	for _, v := range envs {
		out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", "hostname; cat /root/who")
		if err != nil {
			t.Fatal(err, out)
		}
		if want := v.name + "\n" + v.name + "\n"; out != want {
			t.Fatalf("%s: got %q, want %q", v.name, out, want)
		}
	}
}

// TestGuestAgentNotAnswering boots a guest whose init never answers: start
// must give up after the boot timeout with a message that says where to
// look, mark the sandbox crashed, and leave no process behind.
func TestGuestAgentNotAnswering(t *testing.T) {
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	home := vmHome(t, bin)
	init := filepath.Join(t.TempDir(), "hanginit")
	build := exec.Command("go", "build", "-o", init, "./testdata/hanginit")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build hanginit: %v\n%s", err, out)
	}
	v := &vmEnv{t: t, bin: bin, home: home, name: "hang"}
	v.smx("agent", "rm", "-f", v.name)
	if out, err := v.smx("agent", "create", v.name); err != nil {
		t.Fatal(err, out)
	}
	defer v.smx("agent", "rm", "-f", v.name)
	c := v.cmd("agent", "start", v.name)
	c.Env = append(c.Env, "SMX_AGENT="+init, "SMX_BOOT_TIMEOUT=8s")
	out, err := c.CombinedOutput()
	if err == nil {
		t.Fatalf("start succeeded with a guest that never answers:\n%s", out)
	}
	if !strings.Contains(string(out), "did not answer within 8s") || !strings.Contains(string(out), "console.log") {
		t.Fatalf("start error does not say what happened and where to look:\n%s", out)
	}
	ls, _ := v.smx("agent", "inspect", "--json", v.name)
	if !strings.Contains(ls, `"status": "crashed"`) {
		t.Fatalf("sandbox not marked crashed:\n%s", ls)
	}
	if strings.Contains(ls, `"qemu_pid": `) {
		pid := 0
		fmt.Sscanf(ls[strings.Index(ls, `"qemu_pid": `)+len(`"qemu_pid": `):], "%d", &pid)
		deadline := time.Now().Add(10 * time.Second)
		for pid > 0 && alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("QEMU %d still running after a failed start", pid)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
