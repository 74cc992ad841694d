package cli_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/smx-dev/smx/internal/preset"
	"github.com/smx-dev/smx/internal/testutil"
)

// dockerProfile is the user's profile `agent run docker --profile` puts
// the docker preset's layer on: it allows the test's registry,
// registry.test, and not elsewhere.test, which serves the same images.
const dockerProfile = `extends: dev
network:
  allow:
    - domain: registry.test
      ports: [443, 80]
`

// TestAgentRunDocker runs Docker Engine in the docker preset's sandbox
// against a real registry (go-containerregistry's) serving TLS in a test
// network namespace under two names: `docker run` of an image pulled from
// the allowed one prints its output, `docker build` of a Dockerfile FROM
// it runs its RUN step (containers, overlayfs, cgroups v2, namespaces,
// the bridge network's netfilter rules: the smx kernel's), the pulls are
// allowed flows in the sandbox's log, and a pull from the name the
// profile does not allow is refused, with a refusal in the log.
func TestAgentRunDocker(t *testing.T) {
	testutil.RequireQEMU(t)
	testutil.RequireNetNS(t)
	bin := testutil.Binaries(t)
	home := t.TempDir()
	testutil.AwaitSandboxesGone(t, bin, home)
	os.Symlink(testutil.KernelCache(t), filepath.Join(home, "kernels"))
	presetImage(t, home, "docker")

	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	pushTinyImage(t, reg)
	h := testutil.NewNetHostNoHTTPS(t)
	var cas []byte
	for i, host := range []string{"registry.test", "elsewhere.test"} {
		ca, _, cert := testutil.TestCert(t, host)
		cas = append(cas, ca...)
		srv := &http.Server{Handler: reg, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
		go srv.ServeTLS(h.Listen(t, "tcp4", h.PublicIPs[i].String()+":443"), "", "")
		t.Cleanup(func() { srv.Close() })
	}
	hosts := testutil.HostsFile(t, map[string]string{"registry.test": h.PublicIPs[0].String(), "elsewhere.test": h.PublicIPs[1].String()})

	work := t.TempDir()
	os.WriteFile(filepath.Join(work, "Dockerfile"), []byte("FROM registry.test/tiny:1\nRUN echo built > /x\n"), 0o644)
	profile := filepath.Join(t.TempDir(), "registry.yaml")
	os.WriteFile(profile, []byte(dockerProfile), 0o644)
	v := &vmEnv{t: t, bin: bin, home: home, name: "docker-e2e"}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", v.name) })
	run := func(stdin []byte, args ...string) string {
		t.Helper()
		c := v.cmd(args...)
		c.Env = append(c.Env, "SMX_HOSTS_FILE="+hosts)
		if stdin != nil {
			c.Stdin = bytes.NewReader(stdin)
		}
		began := time.Now()
		out, err := c.CombinedOutput()
		t.Logf("smx %s: %s", strings.Join(args, " "), time.Since(began).Round(100*time.Millisecond))
		if err != nil {
			t.Fatalf("smx %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}

	run(nil, "agent", "run", "docker", work, "-d", "--name", v.name, "--profile", profile)
	// The registries' CAs, where dockerd looks for a registry's own CA.
	for _, r := range []string{"registry.test", "elsewhere.test"} {
		run(cas, "agent", "exec", "-i", v.name, "--", "sh", "-c", "mkdir -p /etc/docker/certs.d/"+r+" && cat > /etc/docker/certs.d/"+r+"/ca.crt")
	}

	// The preset's user reaches dockerd without sudo.
	if out := run(nil, "agent", "exec", "-u", "user", v.name, "--", "docker", "run", "--rm", "registry.test/tiny:1", "echo", "hi"); !regexp.MustCompile(`(?m)^hi\r?$`).MatchString(out) {
		t.Fatalf("docker run printed:\n%s", out)
	}
	run(nil, "agent", "exec", "-u", "user", "-w", "/work", v.name, "--", "docker", "build", "-t", "built", ".")
	if out := run(nil, "agent", "exec", "-u", "user", v.name, "--", "docker", "run", "--rm", "built", "cat", "/x"); !strings.Contains(out, "built") {
		t.Fatalf("the built image's /x:\n%s", out)
	}

	// What proves the kernel is smx's own (Debian's stock one would load
	// the same features as modules).
	if out := run(nil, "agent", "exec", v.name, "--", "uname", "-r"); !strings.Contains(out, "-smx-") {
		t.Errorf("the sandbox ran kernel %q, not smx's own", out)
	}

	// A container's connections leave through the same gateway: the
	// allowed name is reached, an address no rule names is refused.
	ip1 := h.PublicIPs[1].String()
	out := run(nil, "agent", "exec", "-u", "user", v.name, "--", "docker", "run", "--rm", "registry.test/tiny:1", "sh", "-c",
		`printf 'GET / HTTP/1.0\r\nHost: registry.test\r\n\r\n' | nc -w 10 registry.test 80; `+
			"nc -w 10 "+ip1+" 81 </dev/null && echo connected || echo refused")
	if !strings.Contains(out, "hello from netns") || !strings.Contains(out, "refused") {
		t.Fatalf("a container's connections:\n%s", out)
	}
	expectRecord(t, v, "net.refused", "", `^default deny$`, ip1+":81")

	c := v.cmd("agent", "exec", "-u", "user", v.name, "--", "docker", "pull", "elsewhere.test/tiny:1")
	if out, err := c.CombinedOutput(); err == nil || strings.Contains(string(out), "Downloaded") {
		t.Fatalf("a pull from elsewhere.test, which the profile does not allow, worked:\n%s", out)
	} else {
		t.Logf("the refused pull: %s", out)
	}

	// The refused name is a refusal in the log.
	expectRecord(t, v, "net.refused", "elsewhere.test", "", "")

	// A stop and a cold start boot the guest afresh: dockerd is started
	// again, and the images built are still on the disk.
	run(nil, "agent", "stop", v.name)
	run(nil, "agent", "start", v.name)
	if out := run(nil, "agent", "exec", "-u", "user", v.name, "--", "docker", "run", "--rm", "built", "cat", "/x"); !strings.Contains(out, "built") {
		t.Fatalf("after a restart, the built image's /x:\n%s", out)
	}

	// The pulls are flows the gateway allowed by the user's rule, logged
	// when dockerd's connections ended (at the latest, with the stop).
	expectRecord(t, v, "net.flow", "registry.test", `network\.allow\[\d+\] domain registry\.test`, "")
}

// expectRecord waits up to three minutes for a record of kind in the
// sandbox's log whose host (or sni) is host, whose rule matches rule and
// whose destination is dst ("": any).
func expectRecord(t *testing.T, v *vmEnv, kind, host, rule, dst string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := v.cmd("agent", "logs", v.name, "--json").Output()
		if err != nil {
			t.Fatalf("logs: %v", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(out))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var r logRecord
			if json.Unmarshal(sc.Bytes(), &r) != nil || r.Kind != kind {
				continue
			}
			if (host == "" || r.f("host") == host || r.f("sni") == host) && (rule == "" || regexp.MustCompile(rule).MatchString(r.f("rule"))) &&
				(dst == "" || r.f("dst") == dst) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s record for %q (rule %q, dst %q) in the log:\n%s", kind, host, rule, dst, out)
		}
		time.Sleep(2 * time.Second)
	}
}

// tinyRootfs is a root filesystem tar: the host's static busybox as sh,
// echo, cat, printf and nc.
func tinyRootfs(t *testing.T) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	testutil.Require(t, err == nil, "a static busybox at /bin/busybox", "apt-get install busybox-static")
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755})
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	for _, l := range []string{"sh", "echo", "cat", "printf", "nc"} {
		tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + l, Linkname: "busybox", Mode: 0o777})
	}
	tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777})
	tw.Close()
	return buf.Bytes()
}

// pushTinyImage pushes tiny:1 into reg: tinyRootfs in one layer.
func pushTinyImage(t *testing.T, reg http.Handler) {
	t.Helper()
	rootfs := tinyRootfs(t)
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(rootfs)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Cmd: []string{"sh"}, Env: []string{"PATH=/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(reg)
	defer srv.Close()
	ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://") + "/tiny:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
}

// TestAgentRunDockerFlag runs the shell preset with --docker: its own
// image (the shell's packages and the docker preset's), dockerd started
// before the shell, and a container made from a root filesystem the
// command reads on stdin (no registry), its output plain on stdout. The
// image is not built by CI (slow suite, SMX_TEST_SLOW=1).
func TestAgentRunDockerFlag(t *testing.T) {
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	home := t.TempDir()
	testutil.AwaitSandboxesGone(t, bin, home)
	os.Symlink(testutil.KernelCache(t), filepath.Join(home, "kernels"))
	p, err := preset.Get("shell", "")
	if err != nil {
		t.Fatal(err)
	}
	if p, err = p.WithDocker(); err != nil {
		t.Fatal(err)
	}
	img, dir := p.ImageName(), os.Getenv("SMX_TEST_IMAGES")
	if _, err := os.Stat(filepath.Join(dir, img, "image.json")); dir == "" || err != nil {
		if dir == "" || os.Getenv("SMX_TEST_SLOW") != "1" {
			t.Skipf("slow suite: the image of the shell preset with --docker (%s) is built in $SMX_TEST_IMAGES with SMX_TEST_SLOW=1", img)
		}
		began := time.Now()
		c := testutil.SmxCmd(bin, filepath.Dir(dir), "image", "preset", "shell", "--docker")
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("smx image preset shell --docker (SMX_HOME=%s): %v\n%s", filepath.Dir(dir), err, out)
		}
		t.Logf("built %s in %s", img, time.Since(began).Round(time.Second))
	}
	linkImage(t, home, dir, img)

	v := &vmEnv{t: t, bin: bin, home: home}
	c := v.cmd("agent", "run", "shell", t.TempDir(), "--docker", "--rm", "--",
		"-c", "docker import - tiny >/dev/null && docker run --rm tiny echo hi from a container")
	c.Stdin = bytes.NewReader(tinyRootfs(t))
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	began := time.Now()
	if err := c.Run(); err != nil {
		t.Fatalf("agent run shell --docker: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	t.Logf("agent run shell --docker: %s", time.Since(began).Round(100*time.Millisecond))
	if stdout.String() != "hi from a container\n" {
		t.Fatalf("stdout %q, want the container's line alone; stderr:\n%s", stdout.String(), stderr.String())
	}
}
