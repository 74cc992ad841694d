package cli_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/testutil"
	"github.com/smx-dev/smx/internal/vm/qmp"
)

// TestCredentialBrokering: a model-API call from inside the VM carries the
// host's key upstream, while the guest only ever holds a placeholder. The
// upstream is a real HTTPS server in a network namespace; the guest's
// client verifies the gateway against its own trust store (where smx-agent
// installed the sandbox CA); afterwards the secret is looked for in the
// guest's process environments, its files and a dump of its whole RAM.
func TestCredentialBrokering(t *testing.T) {
	testutil.RequireQEMU(t)
	h := testutil.NewNetHost(t)
	probe := testutil.NetProbe(t)
	bin := testutil.Binaries(t)
	const secret = "sk-test-7c1b9e0d4a2f"
	const port = 8443

	// The upstream: its own CA, trusted by the gateway through the
	// host-side SMX_EXTRA_CA_FILE (never by the guest).
	caFile, keys := modelUpstream(t, h, port)

	home := t.TempDir()
	os.Symlink(testutil.KernelCache(t), filepath.Join(home, "kernels"))
	v := &vmEnv{t: t, bin: bin, home: home, name: "broker"}
	if out, err := v.smx("image", "build", "busybox"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	v.setCred("model-key", secret)
	profile := filepath.Join(t.TempDir(), "model.yaml")
	os.WriteFile(profile, []byte(fmt.Sprintf(`network:
  mode: default-deny
  allow:
    - domain: api.model.test
      ports: [%d]
credentials:
  - name: model
    from: model-key
    domain: api.model.test
    header: x-api-key
`, port)), 0o644)
	hosts := testutil.HostsFile(t, map[string]string{"api.model.test": h.PublicIPs[0].String()})
	if out, err := v.smx("agent", "create", v.name, "--memory", "256M", "--profile", profile, "-e", "MODEL_API_KEY=smx-placeholder"); err != nil {
		t.Fatalf("create: %v\n%s", err, out)
	}
	t.Cleanup(func() { v.smx("agent", "rm", "-f", v.name) })
	start := v.cmd("agent", "start", v.name)
	start.Env = append(start.Env, "SMX_HOSTS_FILE="+hosts, "SMX_EXTRA_CA_FILE="+caFile)
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("start: %v\n%s", err, out)
	}
	if out, err := v.smx("agent", "cp", probe, v.name+":/usr/bin/netprobe"); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}

	out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", fmt.Sprintf(`netprobe vget https://api.model.test:%d/v1/messages x-api-key "$MODEL_API_KEY"`, port))
	if err != nil || !strings.Contains(out, "200 OK") || !strings.Contains(out, "model says hi") {
		t.Fatalf("guest request through the broker: %v\n%s", err, out)
	}
	if got := keys(); len(got) != 1 || got[0] != secret {
		t.Fatalf("upstream saw x-api-key %q, want the host's secret", got)
	}

	// The secret is nowhere in the guest: environments, files, RAM. The
	// pattern must not carry the secret in: "[f]" matches "f" without
	// the literal ever being written into the guest.
	pattern := secret[:len(secret)-1] + "[" + secret[len(secret)-1:] + "]"
	out, _ = v.smx("agent", "exec", v.name, "--", "sh", "-c",
		"cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep MODEL_API_KEY; grep -r -l '"+pattern+"' /etc /root /tmp /usr /home /run 2>/dev/null; echo scanned")
	if strings.Contains(out, secret) || !strings.Contains(out, "MODEL_API_KEY=smx-placeholder") || !strings.Contains(out, "scanned") {
		t.Fatalf("guest scan:\n%s", out)
	}
	// A canary the guest does hold proves the dump covers its memory.
	const canary = "canary-5e3d8c1f0b"
	if out, err := v.smx("agent", "exec", v.name, "--", "sh", "-c", "echo "+canary+" > /tmp/canary"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	ram := dumpGuestRAM(t, v, 256<<20)
	if !bytes.Contains(ram, []byte(canary)) {
		t.Fatal("the memory dump does not show what the guest holds")
	}
	if bytes.Contains(ram, []byte(secret)) {
		t.Fatal("the secret is in the guest's memory")
	}

	// Each use is logged by name, never by value.
	logs, err := v.smx("agent", "logs", v.name, "--json")
	if err != nil || !strings.Contains(logs, `"kind":"cred.use"`) || !strings.Contains(logs, "model-key") {
		t.Fatalf("no cred.use record: %v\n%s", err, logs)
	}
	if strings.Contains(logs, secret) {
		t.Fatal("the secret is in the log")
	}
}

// dumpGuestRAM saves the guest's physical memory through QMP pmemsave and
// returns it.
func dumpGuestRAM(t *testing.T, v *vmEnv, size int64) []byte {
	t.Helper()
	m := &sandbox.Manager{State: statedir.Dir{Root: v.home}}
	p := m.Paths(v.name)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir, err := os.Open(p.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	c, err := qmp.Dial(ctx, fmt.Sprintf("/proc/self/fd/%d/qmp-operator.sock", dir.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dump := filepath.Join(t.TempDir(), "ram")
	if err := c.Execute(ctx, "pmemsave", map[string]any{"val": 0, "size": size, "filename": dump}, nil); err != nil {
		t.Fatalf("pmemsave: %v", err)
	}
	b, err := os.ReadFile(dump)
	if err != nil || int64(len(b)) < size/2 {
		t.Fatalf("memory dump: %d bytes, %v", len(b), err)
	}
	return b
}

// modelUpstream serves a stand-in model API over HTTPS on port in h's
// namespace, under its own CA (caFile, for the gateway's
// SMX_EXTRA_CA_FILE, never the guest's): every request is answered
// "model says hi", and keys returns the x-api-key each one carried.
func modelUpstream(t *testing.T, h *testutil.NetHost, port int) (caFile string, keys func() []string) {
	t.Helper()
	_, caFile, cert := testutil.TestCert(t, "api.model.test")
	var mu sync.Mutex
	var got []string
	ln := h.Listen(t, "tcp4", fmt.Sprintf(":%d", port))
	srv := &http.Server{
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = append(got, r.Header.Get("x-api-key"))
			mu.Unlock()
			fmt.Fprintln(w, "model says hi")
		}),
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return caFile, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}
