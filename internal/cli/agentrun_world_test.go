package cli_test

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/preset"
	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/presets"
)

// The agent end-to-end tests (TestAgentRunClaude, TestAgentRunCodex,
// TestAgentRunGemini) run a real agent CLI in its preset's image against a
// scripted model server (test code, one per API) and a real git forge. The
// world they share is built by newAgentWorld; each test states only its
// preset, the model's API name and server, how it logs in and what its
// transcript must show.

// presetImage links a preset's image (built once by scripts/test.sh with
// `smx image preset NAME` into $SMX_TEST_IMAGES) into home.
func presetImage(t *testing.T, home, name string) string {
	t.Helper()
	p, err := preset.Get(name, "")
	if err != nil {
		t.Fatal(err)
	}
	img, dir := p.ImageName(), os.Getenv("SMX_TEST_IMAGES")
	_, err = os.Stat(filepath.Join(dir, img, "image.json"))
	testutil.Require(t, dir != "" && err == nil, "the "+name+" preset's image "+img,
		"run scripts/test.sh, which builds it once (`smx image preset "+name+"` into $SMX_TEST_IMAGES)")
	linkImage(t, home, dir, img)
	return img
}

// slowPresetImage is presetImage for a preset whose image CI does not
// build (it would add minutes to every run): it uses the image when
// $SMX_TEST_IMAGES has it, builds it there when SMX_TEST_SLOW=1 (once per
// recipe, like scripts/test.sh does for claude and codex), and otherwise
// skips, saying how to run it, even under CI=true.
func slowPresetImage(t *testing.T, bin, home, name string) string {
	t.Helper()
	p, err := preset.Get(name, "")
	if err != nil {
		t.Fatal(err)
	}
	img, dir := p.ImageName(), os.Getenv("SMX_TEST_IMAGES")
	if dir == "" {
		t.Skipf("slow suite: the %s preset's image needs SMX_TEST_IMAGES (a directory of images) and SMX_TEST_SLOW=1 to build it there", name)
	}
	if _, err := os.Stat(filepath.Join(dir, img, "image.json")); err != nil {
		if os.Getenv("SMX_TEST_SLOW") != "1" {
			t.Skipf("slow suite: the %s preset's image %s is not in %s; SMX_TEST_SLOW=1 builds it there (minutes, once per recipe)", name, img, dir)
		}
		began := time.Now()
		c := testutil.SmxCmd(bin, filepath.Dir(dir), "image", "preset", name)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("smx image preset %s (SMX_HOME=%s): %v\n%s", name, filepath.Dir(dir), err, out)
		}
		t.Logf("built the %s preset's image %s in %s", name, img, time.Since(began).Round(time.Second))
	}
	linkImage(t, home, dir, img)
	return img
}

func linkImage(t *testing.T, home, dir, img string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(home, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, img), filepath.Join(home, "images", img)); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
}

// agentWorld is one agent end-to-end test's world: a state directory with
// the kernels and the preset's image; a network host serving the scripted
// model over HTTPS under the real API name (hosts file and a test CA the
// gateway trusts: host-side settings only) and a real git http-backend as
// forge.test whose main branch the profile protects; a checkout of its repo
// (owned by a non-root user when the test runs as root, as with
// `sudo smx agent run` on a desktop); and the forge token in the host's
// store.
type agentWorld struct {
	*vmEnv
	preset  string
	work    string // the host checkout mounted at /work
	forge   *testutil.GitForge
	profile string   // the profile file given to `agent run --profile`
	env     []string // the host-side settings `agent run` needs
	hostUID int
	hostGID int
}

const worldForgeToken = "ghp_agentrun_world_8e2d1c0b9a7f"

// worldProfile allows the forge and every push but to main: line 12
// column 11 is the rule the refusal cites.
const worldProfile = `extends: dev
network:
  allow:
    - domain: forge.test
      ports: [8443]
git:
  repos:
    - repo: forge.test/acme/*
      read: allow
      push: allow
      refs:
        - ref: refs/heads/main
          push: deny
credentials:
  - name: forge
    from: forge-token
    forge: forge.test
`

// newAgentWorld builds the world for presetName, its model served by
// model as apiHost:443. A slow preset's image is not built by CI
// (slowPresetImage).
func newAgentWorld(t *testing.T, presetName, apiHost string, model http.Handler, slow bool) *agentWorld {
	t.Helper()
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	home := t.TempDir()
	testutil.AwaitSandboxesGone(t, bin, home)
	os.Symlink(testutil.KernelCache(t), filepath.Join(home, "kernels"))
	if slow {
		slowPresetImage(t, bin, home, presetName)
	} else {
		presetImage(t, home, presetName)
	}
	h := testutil.NewNetHostNoHTTPS(t)

	modelCA, _, modelCert := testutil.TestCert(t, apiHost)
	msrv := &http.Server{Handler: model, TLSConfig: &tls.Config{Certificates: []tls.Certificate{modelCert}}}
	go msrv.ServeTLS(h.Listen(t, "tcp4", h.PublicIPs[0].String()+":443"), "", "")
	t.Cleanup(func() { msrv.Close() })

	forge := testutil.NewGitForge(t, "forge.test", worldForgeToken)
	forge.NewRepo(t, "acme/app.git", 2)
	forge.Serve(t, h.Listen(t, "tcp4", h.PublicIPs[1].String()+":8443"))
	caFile := filepath.Join(t.TempDir(), "cas.pem")
	forgeCA, _ := os.ReadFile(forge.CAFile)
	os.WriteFile(caFile, append(append([]byte{}, modelCA...), forgeCA...), 0o644)
	// newhost.test: a host no profile names (NetHost's HTTP on port 80).
	hosts := testutil.HostsFile(t, map[string]string{apiHost: h.PublicIPs[0].String(), "forge.test": h.PublicIPs[1].String(),
		"newhost.test": h.PublicIPs[2].String()})

	w := &agentWorld{
		vmEnv:  &vmEnv{t: t, bin: bin, home: home, name: presetName + "-e2e"},
		preset: presetName,
		work:   filepath.Join(t.TempDir(), "app"),
		forge:  forge,
		env:    []string{"SMX_HOSTS_FILE=" + hosts, "SMX_EXTRA_CA_FILE=" + caFile, "TERM=dumb"},
	}
	testutil.Git(t, "", "clone", "-q", filepath.Join(forge.Root, "acme/app.git"), w.work)
	testutil.Git(t, w.work, "remote", "set-url", "origin", "https://forge.test:8443/acme/app")
	testutil.Git(t, w.work, "config", "user.name", "agent")
	testutil.Git(t, w.work, "config", "user.email", "agent@example.test")
	os.WriteFile(filepath.Join(w.work, "README.md"), []byte("app\n"), 0o644)
	testutil.Git(t, w.work, "add", "README.md")
	testutil.Git(t, w.work, "commit", "-qm", "readme")

	// Run as root (CI), the checkout belongs to a user: what the agent
	// writes must be that user's.
	w.hostUID, w.hostGID = os.Getuid(), os.Getgid()
	if w.hostUID == 0 {
		w.hostUID, w.hostGID = 4242, 4242
		filepath.WalkDir(w.work, func(p string, _ fs.DirEntry, err error) error {
			if err == nil {
				err = os.Lchown(p, w.hostUID, w.hostGID)
			}
			return err
		})
	}

	w.setCred("forge-token", worldForgeToken)
	w.profile = filepath.Join(t.TempDir(), "repo.yaml")
	os.WriteFile(w.profile, []byte(worldProfile), 0o644)
	t.Cleanup(func() { w.smx("agent", "rm", "-f", w.name) })
	return w
}

// overridePreset writes a user preset of the same name as the shipped one,
// with line from replaced by to (the same recipe, so the same image).
func (w *agentWorld) overridePreset(from, to string) {
	w.t.Helper()
	overridePreset(w.t, w.home, w.preset, from, to)
}

// overridePreset writes home's user preset name: the shipped one with
// text from replaced by to.
func overridePreset(t *testing.T, home, name, from, to string) {
	t.Helper()
	shipped, err := presets.FS.ReadFile(name + ".yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(shipped, []byte(from)) {
		t.Fatalf("%s.yaml has no %q", name, from)
	}
	dir := filepath.Join(home, ".config", "smx", "presets")
	os.MkdirAll(dir, 0o755)
	if err := os.WriteFile(filepath.Join(dir, name+".yaml"), bytes.Replace(shipped, []byte(from), []byte(to), 1), 0o644); err != nil {
		t.Fatal(err)
	}
}

// login runs `smx creds login` with args and extra environment, and wants
// its output to contain want.
func (w *agentWorld) login(want string, env []string, args ...string) {
	w.t.Helper()
	c := w.cmd(append([]string{"creds", "login", w.preset}, args...)...)
	c.Env = append(c.Env, env...)
	if out, err := c.CombinedOutput(); err != nil || !strings.Contains(string(out), want) {
		w.t.Fatalf("creds login %s: %v (want %q)\n%s", w.preset, err, want, out)
	}
}

// run runs `smx agent run PRESET WORK` on the world's profile with the
// agent's arguments and returns its transcript (stdout and stderr), and
// the error.
func (w *agentWorld) run(agentArgs ...string) (string, error) {
	w.t.Helper()
	c := w.cmd(append([]string{"agent", "run", w.preset, w.work, "--name", w.name, "--profile", w.profile, "--"}, agentArgs...)...)
	c.Env = append(c.Env, w.env...)
	began := time.Now()
	out, err := c.CombinedOutput()
	w.t.Logf("agent run took %s", time.Since(began).Round(time.Second))
	return string(out), err
}

// cmdEnv is w.cmd with the world's host-side settings.
func (w *agentWorld) cmdEnv(args ...string) *exec.Cmd {
	c := w.cmd(args...)
	c.Env = append(c.Env, w.env...)
	return c
}

// start starts `smx agent run PRESET WORK` on the world's profile with
// the agent's arguments in the background, for a test that answers its
// questions meanwhile: it returns the transcript as it grows and the
// run's end; the run is killed if the test ends first.
func (w *agentWorld) start(agentArgs ...string) (*syncBuffer, <-chan error) {
	w.t.Helper()
	run := w.cmdEnv(append([]string{"agent", "run", w.preset, w.work, "--name", w.name, "--profile", w.profile, "--"}, agentArgs...)...)
	out := &syncBuffer{}
	run.Stdout, run.Stderr = out, out
	if err := run.Start(); err != nil {
		w.t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	w.t.Cleanup(func() {
		if run.ProcessState == nil {
			run.Process.Kill()
			<-exited
		}
	})
	return out, exited
}

// finishedAfterAnswer waits up to 10 minutes for a run w.start started,
// its question answered, to end; it must exit 0.
func finishedAfterAnswer(t *testing.T, out *syncBuffer, exited <-chan error) {
	t.Helper()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("agent run after the answer: %v\n%s", err, out.String())
		}
	case <-time.After(10 * time.Minute):
		t.Fatalf("the agent did not finish after the answer\n%s", out.String())
	}
}

// echoSteps is n scripted tool steps, each echoing STEP-i-RAN.
func echoSteps(n int) []string {
	var steps []string
	for i := 1; i <= n; i++ {
		steps = append(steps, fmt.Sprintf("echo STEP-%d-RAN", i))
	}
	return steps
}

// checkOutcome checks what every agent test must leave behind: the edit
// (editLine in README.md) on the host, owned by the host user with
// everything else the agent wrote; main on the forge unmoved; the log
// with model calls under credential (cred.use) and the push refusal; the
// secret in neither the log nor the transcript. It returns the log.
func (w *agentWorld) checkOutcome(out, editLine, credential, secret string) string {
	t := w.t
	t.Helper()
	if b, _ := os.ReadFile(filepath.Join(w.work, "README.md")); !strings.Contains(string(b), editLine) {
		t.Errorf("README.md on the host: %q", b)
	}
	filepath.WalkDir(w.work, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != w.hostUID || int(st.Gid) != w.hostGID {
			t.Errorf("host %s is owned by %d:%d, want the host user %d:%d", p, st.Uid, st.Gid, w.hostUID, w.hostGID)
		}
		return nil
	})
	if log := testutil.Git(t, filepath.Join(w.forge.Root, "acme/app.git"), "log", "--format=%s", "main"); strings.Contains(log, "agent edit") {
		t.Errorf("the push to main reached the forge: %s", log)
	}
	logs, err := w.smx("agent", "logs", w.name, "--json")
	if err != nil {
		t.Fatalf("logs: %v\n%s", err, logs)
	}
	for _, want := range []string{`"kind":"cred.use"`, `"credential":"` + credential + `"`, `"kind":"git.refused"`, `"ref":"refs/heads/main"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s", want)
		}
	}
	if strings.Contains(logs, secret) || strings.Contains(out, secret) {
		t.Error("the key is in the log or the transcript")
	}
	return logs
}

// modelCalls records what a scripted model server was sent: the
// credential header of every request and its method and path.
type modelCalls struct {
	keys  []string
	paths []string
}

// checkKeys checks the credential every model request carried: want on
// each request isModel says is a model call; on no other request unless
// mayCarry allows it (the path matchers keep it from telemetry and
// settings); the guest's placeholder on none.
func checkKeys(t *testing.T, c modelCalls, want string, isModel, mayCarry func(path string) bool) {
	t.Helper()
	if len(c.keys) == 0 {
		t.Fatal("the model server got no request")
	}
	models := 0
	for i, k := range c.keys {
		model := isModel(c.paths[i])
		if model {
			models++
		}
		if model && k != want {
			t.Errorf("%s carried %q, want the host's key", c.paths[i], k)
		}
		if !model && k == want && (mayCarry == nil || !mayCarry(c.paths[i])) {
			t.Errorf("%s carried the host's key", c.paths[i])
		}
		if strings.Contains(k, "placeholder") {
			t.Errorf("%s carried the guest's placeholder", c.paths[i])
		}
	}
	if models == 0 {
		t.Errorf("no model call among %q", c.paths)
	}
}
