package shim_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/smx-dev/smx/internal/shim"
	"github.com/smx-dev/smx/internal/testutil"
)

const (
	testImage = "smx.test/busybox:1"
	// appImage is testImage with a marker file: a pod's app container
	// on it has its own root, distinct from the pod VM's.
	appImage = "smx.test/app:1"
)

// node is a private containerd (Debian's, with its own root, state,
// socket and config) whose PATH finds the shim under test, on a private
// smx state directory.
type node struct {
	t    testing.TB
	dir  string // containerd's root, state, socket, config
	home string // SMX_HOME
	bin  string
	sock string
	env  []string
}

func startNode(t testing.TB) *node { return startNodeWith(t, "") }

// startNodeWith is startNode with the given extra containerd
// configuration; a non-empty one enables the CRI plugin (it configures
// it).
func startNodeWith(t testing.TB, extra string) *node {
	t.Helper()
	testutil.RequireQEMU(t)
	for _, tool := range []string{"containerd", "ctr", "runc"} {
		_, err := exec.LookPath(tool)
		testutil.Require(t, err == nil, tool, "apt-get install containerd runc (or run scripts/test.sh)")
	}
	testutil.Require(t, os.Geteuid() == 0, "root", "containerd needs root: run as root")
	bin := testutil.Binaries(t)
	_, err := os.Stat(filepath.Join(bin, "containerd-shim-smx-v1"))
	testutil.Require(t, err == nil, "containerd-shim-smx-v1 in "+bin, "make all")
	kernels := testutil.KernelCache(t)

	dir, err := os.MkdirTemp("", "smx-ctd-") // short: socket paths
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "smx")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(kernels, filepath.Join(home, "kernels")); err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, dir: dir, home: home, bin: bin, sock: filepath.Join(dir, "c.sock")}
	disabled := `disabled_plugins = ["io.containerd.grpc.v1.cri"]`
	if extra != "" {
		disabled = ""
	}
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
%s
[grpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), disabled, n.sock) + strings.ReplaceAll(extra, "NODEDIR", dir)
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	n.env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "SMX_HOME="+home, "SMX_BIN="+bin,
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"))
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", filepath.Join(dir, "config.toml"))
	cmd.Env = n.env
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		// Whatever a failed test left: tasks, containers, then containerd;
		// in the CRI plugin's namespace too (a kubelet's pods).
		for _, ns := range []string{"smx", "k8s.io"} {
			out, _ := n.ctrNS(ns, "task", "ls", "-q")
			for _, id := range strings.Fields(out) {
				n.ctrNS(ns, "task", "kill", "-s", "SIGKILL", id)
				time.Sleep(time.Second)
				n.ctrNS(ns, "task", "rm", "-f", id)
			}
			out, _ = n.ctrNS(ns, "container", "ls", "-q")
			for _, id := range strings.Fields(out) {
				n.ctrNS(ns, "container", "rm", id)
			}
		}
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-waited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-waited
		}
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
			t.Logf("containerd log (tail):\n%s", tail(string(b), 4000))
		}
		exec.Command("umount", "-R", filepath.Join(dir, "root")).Run()
		os.RemoveAll(dir)
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := n.ctr("version"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("containerd did not come up in 30s")
		}
		time.Sleep(200 * time.Millisecond)
	}
	return n
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// ctr runs ctr against the node, namespace smx; its combined output.
func (n *node) ctr(args ...string) (string, error) { return n.ctrNS("smx", args...) }

// ctrNS runs ctr in containerd namespace ns.
func (n *node) ctrNS(ns string, args ...string) (string, error) {
	cmd := exec.Command("ctr", append([]string{"-a", n.sock, "-n", ns}, args...)...)
	cmd.Env = n.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// smx runs the smx CLI on the node's state directory.
func (n *node) smx(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(n.bin, "smx"), args...)
	cmd.Env = n.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// command is ctr against the node, namespace smx, not started.
func (n *node) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"-a", n.sock, "-n", "smx"}, args...)...)
	cmd.Env = n.env
	return cmd
}

// run is `ctr run --rm --runtime io.containerd.smx.v1 IMAGE ID ARGS...`:
// its stdout, stderr and exit code.
func (n *node) run(ctx context.Context, id string, args ...string) (stdout, stderr string, code int) {
	n.t.Helper()
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"-a", n.sock, "-n", "smx", "run", "--rm",
		"--runtime", shim.RuntimeName, testImage, id}, args...)...)
	cmd.Env = n.env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		n.t.Fatalf("ctr run %v: %v", args, err)
	}
	return o.String(), e.String(), cmd.ProcessState.ExitCode()
}

// busyboxImage writes a docker-archive of testImage: one layer holding
// the host's static busybox and a few applet links.
func busyboxImage(t testing.TB, file string) { imageArchive(t, file, testImage, nil) }

// imageArchive writes a docker-archive of image ref: busybox as in
// testImage, plus files (path: content; a path ending in / is a
// directory, content "->TARGET" a symbolic link), with command cmd
// (default sh).
func imageArchive(t testing.TB, file, ref string, files map[string]string, cmd ...string) {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	testutil.Require(t, err == nil, "/bin/busybox", "apt-get install busybox-static")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"bin/", "etc/", "tmp/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	for _, a := range []string{"sh", "echo", "sleep", "cat", "true", "false", "id", "pwd", "nc", "tr", "grep", "touch", "ls"} {
		tw.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777})
	}
	passwd := "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
	tw.WriteHeader(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(passwd))})
	tw.Write([]byte(passwd))
	for p, c := range files {
		if target, ok := strings.CutPrefix(c, "->"); ok {
			tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777})
			continue
		}
		if strings.HasSuffix(p, "/") {
			tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeDir, Mode: 0o755})
			continue
		}
		tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(c))})
		tw.Write([]byte(c))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cmd) == 0 {
		cmd = []string{"sh"}
	}
	base, err := mutate.ConfigFile(empty.Image, &v1.ConfigFile{
		Architecture: "amd64", OS: "linux",
		Config: v1.Config{Env: []string{"PATH=/bin"}, Cmd: cmd},
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(file, tag, img); err != nil {
		t.Fatal(err)
	}
}

// leftovers lists processes of this node still running: QEMU (its command
// line names the private state directory), supervisors (their
// environment does) and shims (their command line names the socket).
func (n *node) leftovers() []string {
	var left []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		cl := strings.ReplaceAll(string(b), "\x00", " ")
		// A supervisor's command line names only its sandbox; its
		// environment names the node's state directory.
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		ours := strings.Contains(cl, n.dir) || strings.Contains(string(env), "SMX_HOME="+n.home+"\x00")
		if ours && (strings.Contains(cl, "qemu-system") || strings.Contains(cl, "containerd-shim-smx-v1") || strings.Contains(cl, "__supervise")) {
			left = append(left, e.Name()+": "+cl)
		}
	}
	return left
}

func TestContainerd(t *testing.T) {
	start := time.Now()
	n := startNode(t)
	bg := context.Background()
	archive := filepath.Join(n.dir, "busybox.tar")
	busyboxImage(t, archive)
	if out, err := n.ctr("image", "import", archive); err != nil {
		t.Fatalf("ctr image import: %v\n%s", err, out)
	}

	t.Run("echo", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
		defer cancel()
		t0 := time.Now()
		out, errOut, code := n.run(ctx, "echo", "echo", "hi")
		if code != 0 || out != "hi\n" {
			t.Fatalf("ctr run echo hi: code %d, stdout %q, stderr %q", code, out, errOut)
		}
		t.Logf("ctr run echo hi: %v", time.Since(t0).Round(time.Millisecond))
		// The task's sandbox wrote the node's signed log: readable and
		// verifiable with smx, after the sandbox is gone.
		name := shim.SandboxName("smx", "echo", nil)
		logs, err := n.smx("agent", "logs", name)
		if err != nil || !strings.Contains(logs, `"echo"`) || !strings.Contains(logs, shim.DefaultProfile) {
			t.Fatalf("smx agent logs %s: %v\n%s", name, err, logs)
		}
		t.Logf("smx agent logs %s:\n%s", name, logs)
		if out, err := n.smx("agent", "logs", name, "--verify"); err != nil {
			t.Fatalf("smx agent logs --verify: %v\n%s", err, out)
		}
	})

	t.Run("exit-code", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
		defer cancel()
		out, errOut, code := n.run(ctx, "exit3", "sh", "-c", "echo out; echo err >&2; exit 3")
		if code != 3 || out != "out\n" || errOut != "err\n" {
			t.Fatalf("exit 3: code %d, stdout %q, stderr %q", code, out, errOut)
		}
	})

	t.Run("spec", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
		defer cancel()
		// The OCI process spec's cwd and env reach the guest process (this
		// ctr has no flag for the user).
		cmd := exec.CommandContext(ctx, "ctr", "-a", n.sock, "-n", "smx", "run", "--rm",
			"--runtime", shim.RuntimeName, "--cwd", "/tmp", "--env", "GREETING=hello",
			testImage, "spec", "sh", "-c", `echo "$(id -u):$(id -g) $(pwd) $GREETING"`)
		cmd.Env = n.env
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != "0:0 /tmp hello\n" {
			t.Fatalf("spec: %v: %q", err, out)
		}
	})

	t.Run("kill", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "ctr", "-a", n.sock, "-n", "smx", "run", "--rm",
			"--runtime", shim.RuntimeName, testImage, "sleeper", "sleep", "1000")
		cmd.Env = n.env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		// Running once the task lists as RUNNING.
		deadline := time.Now().Add(3 * time.Minute)
		for {
			ls, _ := n.ctr("task", "ls")
			if strings.Contains(ls, "sleeper") && strings.Contains(ls, "RUNNING") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("task never ran: %s\n%s", ls, out.String())
			}
			time.Sleep(300 * time.Millisecond)
		}
		if o, err := n.ctr("task", "kill", "sleeper"); err != nil {
			t.Fatalf("ctr task kill: %v\n%s", err, o)
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("ctr run did not end within a minute of SIGTERM")
		}
		if code := cmd.ProcessState.ExitCode(); code != 128+15 {
			t.Fatalf("killed task: exit code %d, want 143\n%s", code, out.String())
		}
	})

	t.Run("stdin", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
		defer cancel()
		cmd := n.command(ctx, "run", "--rm", "--runtime", shim.RuntimeName, testImage, "stdin", "sh", "-c", "cat; echo done")
		cmd.Stdin = strings.NewReader("line one\nline two\n")
		out, err := cmd.CombinedOutput()
		if err != nil || string(out) != "line one\nline two\ndone\n" {
			t.Fatalf("stdin: %v: %q", err, out)
		}
	})

	t.Run("tty", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
		defer cancel()
		cmd := n.command(ctx, "run", "--rm", "-t", "--runtime", shim.RuntimeName, testImage, "tty",
			"sh", "-c", "[ -t 0 ] && [ -t 1 ] && echo on-a-tty; exit 4")
		ptmx, err := pty.Start(cmd)
		if err != nil {
			t.Fatal(err)
		}
		defer ptmx.Close()
		out, _ := io.ReadAll(ptmx) // ends with EIO once ctr exits
		err = cmd.Wait()
		if !strings.Contains(string(out), "on-a-tty") || cmd.ProcessState.ExitCode() != 4 {
			t.Fatalf("tty: %v, code %d: %q", err, cmd.ProcessState.ExitCode(), out)
		}
	})

	t.Run("profile", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
		defer cancel()
		out, err := n.command(ctx, "run", "--rm", "--runtime", shim.RuntimeName,
			"--annotation", shim.ProfileAnnotation+"=dev", testImage, "prof", "true").CombinedOutput()
		if err != nil {
			t.Fatalf("run with profile dev: %v\n%s", err, out)
		}
		logs, err := n.smx("agent", "logs", shim.SandboxName("smx", "prof", nil))
		if err != nil || !strings.Contains(logs, `profile="dev"`) {
			t.Fatalf("the log does not name profile dev: %v\n%s", err, logs)
		}
		// A profile the node does not have fails the task's creation,
		// saying so, and leaves nothing behind.
		out, err = n.command(ctx, "run", "--rm", "--runtime", shim.RuntimeName,
			"--annotation", shim.ProfileAnnotation+"=no-such-profile", testImage, "badprof", "true").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "no-such-profile") {
			t.Fatalf("unknown profile: %v\n%s", err, out)
		}
		n.ctr("container", "rm", "badprof")
		// open (allow-all) is the node's to allow: by default a task that
		// asks for it fails at creation, saying where to allow it.
		out, err = n.command(ctx, "run", "--rm", "--runtime", shim.RuntimeName,
			"--annotation", shim.ProfileAnnotation+"=open", testImage, "openprof", "true").CombinedOutput()
		if err == nil || !strings.Contains(string(out), `add "open" to pod_profiles in `+filepath.Join(n.home, shim.ConfigFile)) {
			t.Fatalf("profile open without the node's leave: %v\n%s", err, out)
		}
		t.Logf("refused: %s", strings.TrimSpace(string(out)))
		n.ctr("container", "rm", "openprof")
	})

	t.Run("same-metadata", func(t *testing.T) {
		// Two images whose files have equal names, modes, owners, sizes
		// and times and different bytes: a pod author's copy of a public
		// image, run first, must not be what the public image boots.
		ctx, cancel := context.WithTimeout(bg, 3*time.Minute)
		defer cancel()
		for ref, marker := range map[string]string{"smx.test/crafted:1": "crafted\n", "smx.test/genuine:1": "genuine\n"} {
			archive := filepath.Join(n.dir, strings.NewReplacer("/", "-", ":", "-").Replace(ref)+".tar")
			imageArchive(t, archive, ref, map[string]string{"marker": marker})
			if out, err := n.ctr("image", "import", archive); err != nil {
				t.Fatalf("ctr image import: %v\n%s", err, out)
			}
		}
		for _, c := range []struct{ ref, id, want string }{
			{"smx.test/crafted:1", "crafted", "crafted\n"},
			{"smx.test/genuine:1", "genuine", "genuine\n"},
		} {
			cmd := n.command(ctx, "run", "--rm", "--runtime", shim.RuntimeName, c.ref, c.id, "cat", "/marker")
			out, err := cmd.CombinedOutput()
			if err != nil || string(out) != c.want {
				t.Fatalf("%s: cat /marker: %v: %q, want %q", c.ref, err, out, c.want)
			}
		}
	})

	t.Run("egress-refused", func(t *testing.T) {
		// The default profile (locked) refuses all egress, on the host,
		// and the node's log records the refusal.
		ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
		defer cancel()
		// A plain-HTTP request to a refused destination is answered by
		// the gateway itself with a 403 naming the rule (nothing is
		// dialled), so the process inside can tell why.
		out, errOut, code := n.run(ctx, "egress", "sh", "-c",
			`printf 'GET / HTTP/1.0\r\nHost: 192.0.2.7\r\n\r\n' | nc -w 5 192.0.2.7 80`)
		if !strings.Contains(out, "403 Forbidden") || !strings.Contains(out, "refused by the sandbox's network profile") {
			t.Fatalf("HTTP to 192.0.2.7 under profile locked: code %d, stdout %q, stderr %q; want the gateway's 403", code, out, errOut)
		}
		logs, err := n.smx("agent", "logs", shim.SandboxName("smx", "egress", nil), "--refusals")
		if err != nil || !strings.Contains(logs, "192.0.2.7") {
			t.Fatalf("no refusal of 192.0.2.7 in the log (nc: code %d, %q): %v\n%s", code, errOut, err, logs)
		}
	})

	t.Run("exec", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(bg, 2*time.Minute)
		defer cancel()
		if out, err := n.ctr("run", "-d", "--runtime", shim.RuntimeName, testImage, "execd", "sleep", "1000"); err != nil {
			t.Fatalf("ctr run -d: %v\n%s", err, out)
		}
		cmd := n.command(ctx, "task", "exec", "--exec-id", "e1", "--cwd", "/tmp", "execd", "sh", "-c", "echo from-exec $(pwd); exit 5")
		out, _ := cmd.CombinedOutput()
		if string(out) != "from-exec /tmp\n" || cmd.ProcessState.ExitCode() != 5 {
			t.Fatalf("ctr task exec: code %d, output %q", cmd.ProcessState.ExitCode(), out)
		}
		if o, err := n.ctr("task", "kill", "-s", "SIGKILL", "execd"); err != nil {
			t.Fatalf("ctr task kill: %v\n%s", err, o)
		}
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
			ls, _ := n.ctr("task", "ls")
			if strings.Contains(ls, "execd") && strings.Contains(ls, "STOPPED") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("task not stopped a minute after SIGKILL:\n%s", ls)
			}
		}
		if o, err := n.ctr("task", "rm", "execd"); err != nil {
			t.Fatalf("ctr task rm: %v\n%s", err, o)
		}
		if o, err := n.ctr("container", "rm", "execd"); err != nil {
			t.Fatalf("ctr container rm: %v\n%s", err, o)
		}
	})

	t.Run("pod", func(t *testing.T) { testPod(t, n) })
	t.Run("pod-shim-killed", func(t *testing.T) { testPodShimKilled(t, n) })

	t.Run("shim-killed", func(t *testing.T) {
		// A shim that dies takes its sandbox with it: containerd runs the
		// shim binary's delete action, and the supervisor, which the
		// shim owned, stops and removes the sandbox by itself.
		out, err := n.ctr("run", "-d", "--runtime", shim.RuntimeName, testImage, "victim", "sleep", "1000")
		if err != nil && strings.Contains(out, "failed to start shim") {
			// Seen once in about ten full runs, never alone: the new
			// shim process was gone before containerd dialled it, and
			// it logged nothing. What this subtest checks comes after;
			// the start is tried once more, and the first failure kept
			// in the output for whoever finds the cause.
			t.Logf("ctr run -d victim, first try: %v\n%s", err, out)
			n.ctr("container", "rm", "victim")
			out, err = n.ctr("run", "-d", "--runtime", shim.RuntimeName, testImage, "victim", "sleep", "1000")
		}
		if err != nil {
			t.Fatalf("ctr run -d: %v\n%s", err, out)
		}
		var pid int
		for _, l := range n.leftovers() {
			if strings.Contains(l, "containerd-shim-smx-v1") && strings.Contains(l, "-id victim") {
				fmt.Sscanf(l, "%d:", &pid)
			}
		}
		if pid == 0 {
			t.Fatalf("no shim for task victim among %q", n.leftovers())
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(time.Minute)
		for {
			ls, _ := n.ctr("task", "ls")
			if !strings.Contains(ls, "victim") || !strings.Contains(ls, "RUNNING") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("task still running a minute after its shim was killed:\n%s", ls)
			}
			time.Sleep(300 * time.Millisecond)
		}
		n.ctr("task", "rm", "-f", "victim")
		if out, err := n.ctr("container", "rm", "victim"); err != nil {
			t.Fatalf("ctr container rm: %v\n%s", err, out)
		}
	})

	t.Run("cleanup", func(t *testing.T) {
		// Every task above was run with --rm: no shim, supervisor or QEMU
		// of this node may be left, and no sandbox in its state directory.
		n.awaitGone(t, "at the end")
		ents, _ := os.ReadDir(filepath.Join(n.home, "sandboxes"))
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				t.Errorf("sandbox %s left in the state directory", e.Name())
			}
		}
	})
	t.Logf("TestContainerd total %v", time.Since(start).Round(time.Millisecond))
}

// BenchmarkCtrRun is `ctr run --rm IMAGE ID true` through this runtime
// and through runc side by side, on one private containerd: the time from
// the client's call to the task's end and removal. The smx side restores
// its boot template after the first run (the image's content is imported
// once).
func BenchmarkCtrRun(b *testing.B) {
	n := startNode(b)
	archive := filepath.Join(n.dir, "busybox.tar")
	busyboxImage(b, archive)
	if out, err := n.ctr("image", "import", archive); err != nil {
		b.Fatalf("ctr image import: %v\n%s", err, out)
	}
	for _, rt := range []struct{ name, runtime string }{{"smx", shim.RuntimeName}, {"runc", "io.containerd.runc.v2"}} {
		b.Run("ctr-"+rt.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				id := fmt.Sprintf("bench-%s-%d", rt.name, i)
				out, err := n.command(context.Background(), "run", "--rm", "--runtime", rt.runtime, testImage, id, "true").CombinedOutput()
				if err != nil {
					b.Fatalf("ctr run --runtime %s: %v\n%s", rt.runtime, err, out)
				}
			}
		})
	}
	// The nearest peer: `smx run` of the image the shim made of the same
	// root filesystem, same profile.
	b.Run("smx-run", func(b *testing.B) {
		out, err := n.smx("image", "ls")
		img := ""
		for _, f := range strings.Fields(out) {
			if strings.HasPrefix(f, "ctr-") {
				img = f
			}
		}
		if err != nil || img == "" {
			b.Fatalf("no ctr- image: %v\n%s", err, out)
		}
		for b.Loop() {
			if out, err := n.smx("run", "--image", img, "--profile", shim.DefaultProfile, "--", "true"); err != nil {
				b.Fatalf("smx run: %v\n%s", err, out)
			}
		}
	})
}

// running waits until ctr lists task id as RUNNING.
func (n *node) running(t testing.TB, id string) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(300 * time.Millisecond) {
		ls, _ := n.ctr("task", "ls")
		for _, l := range strings.Split(ls, "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == id && f[2] == "RUNNING" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not running after 3 minutes:\n%s", id, ls)
		}
	}
}

// stop kills task id, waits until it stopped, and removes it and its
// container.
func (n *node) stop(t testing.TB, id string) {
	t.Helper()
	if o, err := n.ctr("task", "kill", "-s", "SIGKILL", id); err != nil {
		t.Fatalf("ctr task kill %s: %v\n%s", id, err, o)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
		ls, _ := n.ctr("task", "ls")
		if !strings.Contains(ls, id) || strings.Contains(ls, "STOPPED") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s not stopped a minute after SIGKILL:\n%s", id, ls)
		}
	}
	if o, err := n.ctr("task", "rm", id); err != nil {
		t.Fatalf("ctr task rm %s: %v\n%s", id, err, o)
	}
	if o, err := n.ctr("container", "rm", id); err != nil {
		t.Fatalf("ctr container rm %s: %v\n%s", id, err, o)
	}
}

// awaitGone fails the test, saying when, if the node still runs a QEMU,
// shim or supervisor 15 s from now (teardown is asynchronous).
func (n *node) awaitGone(t testing.TB, when string) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(300 * time.Millisecond) {
		if left = n.leftovers(); len(left) == 0 {
			return
		}
	}
	t.Fatalf("left running %s:\n%s", when, strings.Join(left, "\n"))
}

// count is how many of the node's processes have what in their command
// line (of qemu-system, containerd-shim-smx-v1 and supervisors). A QEMU
// that turns a freshly saved boot template into its shared-RAM form
// (a supervisor's short-lived background work, in a smx-slim- directory,
// never running a guest) is not a sandbox's VM and is not counted.
func (n *node) count(what string) int {
	c := 0
	for _, l := range n.leftovers() {
		if strings.Contains(l, what) && !strings.Contains(l, "/smx-slim-") {
			c++
		}
	}
	return c
}

// testPod runs a pod the way the CRI plugin lays it out (the sandbox
// container, then app containers marked with the pod's sandbox ID), with
// ctr's --annotation: one shim and one VM for all of them.
func testPod(t *testing.T, n *node) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	importAppImage(t, n)
	in := func(typ string) []string {
		return []string{"--runtime", shim.RuntimeName,
			"--annotation", shim.ContainerTypeAnnotation + "=" + typ, "--annotation", shim.SandboxIDAnnotation + "=pod1"}
	}
	args := func(typ string, rest ...string) []string { return append(append([]string{"run"}, in(typ)...), rest...) }

	if out, err := n.ctr(args("sandbox", "-d", "--annotation", shim.ProfileAnnotation+"=podfiles", testImage, "pod1", "sleep", "999")...); err != nil {
		t.Fatalf("sandbox container: %v\n%s", err, out)
	}
	n.running(t, "pod1")
	if out, err := n.ctr(args("container", "-d", appImage, "app2", "sleep", "1000")...); err != nil {
		t.Fatalf("app container app2: %v\n%s", err, out)
	}
	n.running(t, "app2")
	// Shims of earlier tasks may still be on their way out: count this
	// pod's (a shim's command line names the task it was started for).
	if q, sh := n.count("qemu-system"), n.count("-id pod1")+n.count("-id app2"); q != 1 || sh != 1 {
		t.Fatalf("a pod of two running containers has %d QEMU and %d shims, want 1 and 1:\n%s", q, sh, strings.Join(n.leftovers(), "\n"))
	}

	// An app container in the foreground: its own root (the marker),
	// read-only; a volume (bind mount) read-write, on the host; the pod
	// sandbox's process in the same VM; its exit code.
	vol := filepath.Join(n.dir, "vol")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, c := range map[string]string{"in.txt": "from-host\n", "secret.txt": "s3cret\n"} {
		if err := os.WriteFile(filepath.Join(vol, f), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := `cat /app-marker /data/in.txt; pwd; echo from-guest > out.txt
touch /written 2>/dev/null && echo root-writable || echo root-read-only
for f in /proc/[0-9]*/cmdline; do tr "\0" " " < $f; echo; done | grep -c "^sleep 999"
ls /smx-pod 2>/dev/null || echo no-vm-root
cat /data/secret.txt 2>/dev/null || echo secret-refused
cat /evil/x/in.txt
exit 7`
	cmd := n.command(ctx, args("container", "--rm", "--read-only", "--cwd", "/data",
		"--mount", "type=bind,src="+vol+",dst=/data,options=rbind:rw",
		"--mount", "type=bind,src="+vol+",dst=/evil/x,options=rbind:ro", appImage, "app1", "sh", "-c", script)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Run()
	want := "app-root\nfrom-host\n/data\nroot-read-only\n1\nno-vm-root\nsecret-refused\nfrom-host\n"
	if cmd.ProcessState.ExitCode() != 7 || stdout.String() != want {
		t.Fatalf("app container app1: code %d, stdout %q (want %q), stderr %q", cmd.ProcessState.ExitCode(), stdout.String(), want, stderr.String())
	}
	if b, err := os.ReadFile(filepath.Join(vol, "out.txt")); err != nil || string(b) != "from-guest\n" {
		t.Fatalf("the volume's file on the host: %q, %v", b, err)
	}
	// The link's target on the host got no mount point, and the profile's
	// refusal is in the pod's log.
	if _, err := os.Lstat(filepath.Join(n.dir, "victim", "x")); err == nil {
		t.Fatalf("a volume's mount point followed the image's symbolic link to the host's %s", filepath.Join(n.dir, "victim"))
	}
	refusals, err := n.smx("agent", "logs", shim.SandboxName("smx", "pod1", nil), "--refusals")
	if err != nil || !strings.Contains(refusals, "secret.txt") || !strings.Contains(refusals, "podfiles") {
		t.Fatalf("no refusal of secret.txt under profile podfiles in the pod's log: %v\n%s", err, refusals)
	}

	// exec into an app container runs in its root; Pids and Stats.
	out, err := n.command(ctx, "task", "exec", "--exec-id", "e1", "app2", "cat", "/app-marker").CombinedOutput()
	if err != nil || string(out) != "app-root\n" {
		t.Fatalf("ctr task exec app2: %v: %q", err, out)
	}
	ps, err := n.ctr("task", "ps", "app2")
	if err != nil || len(strings.Fields(ps)) < 3 {
		t.Fatalf("ctr task ps app2: %v\n%s", err, ps)
	}
	metrics, err := n.ctr("task", "metrics", "app2")
	if err != nil || !strings.Contains(metrics, "memory.usage_in_bytes") {
		t.Fatalf("ctr task metrics app2: %v\n%s", err, metrics)
	}
	t.Logf("ctr task ps app2:\n%s\nctr task metrics app2:\n%s", ps, metrics)

	// Still one VM; the app container goes, then the pod.
	if q := n.count("qemu-system"); q != 1 {
		t.Fatalf("%d QEMU, want 1:\n%s", q, strings.Join(n.leftovers(), "\n"))
	}
	n.stop(t, "app2")
	if q := n.count("qemu-system"); q != 1 {
		t.Fatalf("the pod's VM went with its app container (%d QEMU)", q)
	}
	n.stop(t, "pod1")
	n.awaitGone(t, "after the pod")
	if b, _ := exec.Command("grep", "-c", n.dir, "/proc/self/mountinfo").Output(); strings.TrimSpace(string(b)) != "0" {
		m, _ := os.ReadFile("/proc/self/mountinfo")
		t.Fatalf("mounts left under %s:\n%s", n.dir, grepLines(string(m), n.dir))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// importAppImage imports appImage into the node, with a symbolic link
// "evil" to the node's directory "victim", and installs the profile
// podfiles.
func importAppImage(t *testing.T, n *node) {
	archive := filepath.Join(n.dir, "app.tar")
	imageArchive(t, archive, appImage, map[string]string{
		"app-marker": "app-root\n", "proc/": "", "sys/": "", "dev/": "", // as in any image docker built
		// A volume's mount point through this link must stay inside the
		// container's root, not land on the host's directory.
		"evil": "->" + filepath.Join(n.dir, "victim"),
	})
	// The pod's profile: the node's locked profile plus one file rule
	// that denies a file of the app container's volume.
	prof := "name: podfiles\nnetwork:\n  mode: deny-all\nfiles:\n  rules:\n    - path: /smx-pod/*/rootfs/data/secret.txt\n      access: deny\n"
	if err := os.MkdirAll(filepath.Join(n.home, "profiles"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(n.home, "profiles", "podfiles.yaml"), []byte(prof), 0o644); err != nil {
		t.Fatal(err)
	}
	// The node lets pods name it (and dev), as its owner would.
	if err := os.WriteFile(filepath.Join(n.home, shim.ConfigFile), []byte("pod_profiles: [dev, podfiles]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(n.dir, "victim"), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := n.ctr("image", "import", archive); err != nil {
		t.Fatalf("ctr image import: %v\n%s", err, out)
	}
}

// testPodShimKilled kills a pod's shim: containerd runs the shim binary's
// delete action for each of the pod's tasks, which removes the VM and
// detaches the app container's mounts before containerd removes the
// bundles, so a volume's files on the host survive.
func testPodShimKilled(t *testing.T, n *node) {
	in := func(typ string) []string {
		return []string{"run", "-d", "--runtime", shim.RuntimeName,
			"--annotation", shim.ContainerTypeAnnotation + "=" + typ, "--annotation", shim.SandboxIDAnnotation + "=pod2"}
	}
	importAppImage(t, n)
	vol := filepath.Join(n.dir, "vol2")
	if err := os.MkdirAll(vol, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "keep.txt"), []byte("keep\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := n.ctr(append(in("sandbox"), testImage, "pod2", "sleep", "999")...); err != nil {
		t.Fatalf("sandbox container: %v\n%s", err, out)
	}
	n.running(t, "pod2")
	if out, err := n.ctr(append(in("container"), "--mount", "type=bind,src="+vol+",dst=/data,options=rbind:rw",
		appImage, "app3", "sleep", "1000")...); err != nil {
		t.Fatalf("app container: %v\n%s", err, out)
	}
	n.running(t, "app3")
	var pid int
	for _, l := range n.leftovers() {
		if strings.Contains(l, "containerd-shim-smx-v1") && strings.Contains(l, "-id pod2") {
			fmt.Sscanf(l, "%d:", &pid)
		}
	}
	if pid == 0 {
		t.Fatalf("no shim for pod2 among %q", n.leftovers())
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
		ls, _ := n.ctr("task", "ls")
		if !strings.Contains(ls, "RUNNING") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tasks still running a minute after their shim was killed:\n%s", ls)
		}
	}
	for _, id := range []string{"app3", "pod2"} {
		n.ctr("task", "rm", "-f", id)
		if out, err := n.ctr("container", "rm", id); err != nil {
			t.Fatalf("ctr container rm %s: %v\n%s", id, err, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(vol, "keep.txt")); err != nil || string(b) != "keep\n" {
		t.Fatalf("the volume's file after the pod's shim was killed: %q, %v", b, err)
	}
	n.awaitGone(t, "after the pod's shim was killed")
	if m, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(m), n.dir) {
		t.Fatalf("mounts left under %s:\n%s", n.dir, grepLines(string(m), n.dir))
	}
}
