package cli_test

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/klauspost/compress/zstd"

	"github.com/smx-dev/smx/internal/ocisnap"
	"github.com/smx-dev/smx/internal/testutil"
)

// nsHost is one simulated host: a state directory whose CLI, and so
// every supervisor and QEMU it starts, runs in a network namespace of
// its own.
type nsHost struct {
	t    *testing.T
	ns   *testutil.NetNS
	bin  string
	home string
}

func (h *nsHost) smx(args ...string) (string, error) {
	c := h.ns.Command(filepath.Join(h.bin, "smx"), args...)
	c.Env = append(os.Environ(), "SMX_HOME="+h.home, "XDG_CONFIG_HOME="+filepath.Join(h.home, ".config"))
	out, err := c.CombinedOutput()
	return string(out), err
}

func (h *nsHost) run(args ...string) string {
	h.t.Helper()
	out, err := h.smx(args...)
	if err != nil {
		h.t.Fatalf("smx %v: %v\n%s", args, err, out)
	}
	return out
}

func (h *nsHost) supervisorNetNS(name string) string {
	h.t.Helper()
	return supervisorNetNS(h.t, h.home, name)
}

// supervisorNetNS is the network namespace sandbox name's supervisor (of
// state directory home) runs in, as /proc shows it ("net:[INODE]").
func supervisorNetNS(t *testing.T, home, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(home, "sandboxes", name, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		PID int `json:"supervisor_pid"`
	}
	json.Unmarshal(b, &st)
	l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", st.PID))
	if err != nil {
		t.Fatalf("supervisor of %s (pid %d): %v", name, st.PID, err)
	}
	return l
}

// privateKeyBytes are byte strings each of which would show one of the
// private keys in dir: each file whole, its DER, each base64 line.
func privateKeyBytes(t *testing.T, dir string, files ...string) [][]byte {
	var out [][]byte
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
		if blk, _ := pem.Decode(b); blk != nil {
			out = append(out, blk.Bytes)
		} else {
			t.Fatalf("%s is not PEM", f)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if len(line) >= 32 && !strings.HasPrefix(line, "-----") {
				out = append(out, []byte(line))
			}
		}
	}
	return out
}

// TestTemplateMovesBetweenHosts: host A, host B and the registry each
// run in a network namespace of their own (A and B reach the registry,
// not each other, and the test's own namespace reaches none of them). A
// boots a sandbox cold, which saves a boot template; A pushes it; B pulls
// it and the first start of a sandbox of the same image and shape on B
// restores it instead of booting. The artifact holds no byte of the
// template's gateway CA keys; B's sandbox has CAs of its own, and its
// guest trusts B's CA, not A's template's. A damaged layer, an untrusted
// signer and a template pulled as a snapshot are each refused with B's
// state directory unchanged.
func TestTemplateMovesBetweenHosts(t *testing.T) {
	testutil.RequireQEMU(t)
	testutil.RequireNetNS(t)
	bin := testutil.Binaries(t)
	kernels := testutil.KernelCache(t)

	nsReg, nsA, nsB := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
	regAddr := nsReg.Reach(t, nsA, nsB)
	flip := &flipRegistry{reg: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	var served atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		flip.ServeHTTP(w, r)
	})}
	go srv.Serve(nsReg.Listen(t, "tcp", regAddr.String()+":5000"))
	t.Cleanup(func() { srv.Close() })
	// The test's own namespace does not reach it (whatever else may
	// answer on that address there).
	hc := &http.Client{Timeout: 2 * time.Second}
	if resp, err := hc.Get("http://" + regAddr.String() + ":5000/v2/"); err == nil {
		resp.Body.Close()
	}
	if served.Load() != 0 {
		t.Fatalf("the registry is reachable from the test's own network namespace: the hosts are not apart")
	}
	// The test reads the registry's blobs through a listener of its own.
	direct := httptest.NewServer(flip.reg)
	defer direct.Close()

	homeA, homeB := t.TempDir(), t.TempDir()
	os.Symlink(kernels, filepath.Join(homeA, "kernels"))
	os.Symlink(kernels, filepath.Join(homeB, "kernels"))
	a := &nsHost{t: t, ns: nsA, bin: bin, home: homeA}
	b := &nsHost{t: t, ns: nsB, bin: bin, home: homeB}
	a.run("image", "build", "busybox")
	b.run("image", "build", "busybox")

	a.run("agent", "create", "tpl-src")
	t.Cleanup(func() { a.smx("agent", "rm", "-f", "tpl-src") })
	a.run("agent", "start", "tpl-src")
	a.run("agent", "exec", "tpl-src", "--", "true")
	var tpls []struct {
		Name string `json:"name"`
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		json.Unmarshal([]byte(a.run("template", "ls", "--json")), &tpls)
		if len(tpls) == 1 || time.Now().After(deadline) {
			break
		}
	}
	if len(tpls) != 1 {
		t.Fatalf("A saved %d templates, want 1", len(tpls))
	}
	tpl := tpls[0].Name
	tplDir := filepath.Join(homeA, "templates", tpl)
	keyA := filepath.Join(t.TempDir(), "a.pub")
	os.WriteFile(keyA, []byte(a.run("logs", "export-key")), 0o644)

	ref := regAddr.String() + ":5000/templates/busybox:1"
	var pushed struct {
		Kind   string `json:"kind"`
		Layers []struct {
			Role   string `json:"role"`
			Digest string `json:"digest"`
		} `json:"layers"`
		BytesSent int64 `json:"bytes_sent"`
	}
	if err := json.Unmarshal([]byte(a.run("template", "push", tpl, ref, "--json")), &pushed); err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, l := range pushed.Layers {
		roles = append(roles, l.Role)
	}
	if pushed.Kind != "template" || strings.Join(roles, ",") != "meta,memory,disk,base" {
		t.Fatalf("pushed %+v", pushed)
	}

	// No blob holds a byte of the template's private keys; the memory
	// layer holds the CA certificate the template's guest trusts, so the
	// scan reads what the guest holds.
	needles := privateKeyBytes(t, tplDir, "ca.key", "ssh_host_ca")
	cert, err := os.ReadFile(filepath.Join(tplDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(mustParse(t, strings.TrimPrefix(direct.URL, "http://")+"/templates/busybox:1"))
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	sawCert := false
	for _, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		blob, _ := io.ReadAll(rc)
		rc.Close()
		scan := [][]byte{blob}
		if mt, _ := l.MediaType(); string(mt) == ocisnap.MemoryZstdType {
			dec, _ := zstd.NewReader(nil)
			raw, err := dec.DecodeAll(blob, nil)
			if err != nil {
				t.Fatal(err)
			}
			sawCert = bytes.Contains(raw, bytes.TrimSpace(cert))
			scan = append(scan, raw)
		}
		for _, s := range scan {
			for _, n := range needles {
				if bytes.Contains(s, n) {
					mt, _ := l.MediaType()
					t.Errorf("layer %s holds private key bytes", mt)
				}
			}
		}
	}
	if !sawCert {
		t.Errorf("the memory layer does not hold the CA certificate the template's guest trusts: the scan proves nothing")
	}

	// Refusals, each leaving B's state directory as it was.
	before := stateTree(t, homeB)
	refused := func(what, want string, args ...string) {
		t.Helper()
		out, err := b.smx(args...)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		last := lines[len(lines)-1]
		t.Logf("%s: %s", what, last)
		if err == nil || !strings.Contains(last, want) {
			t.Errorf("%s: %v\n%s\nwant %q", what, err, out, want)
		}
		if after := stateTree(t, homeB); after != before {
			t.Errorf("%s changed B's state directory:\n%s\n---\n%s", what, before, after)
		}
	}
	strangerKey, _ := newNoteKey(t)
	a.run("template", "push", tpl, regAddr.String()+":5000/templates/busybox:stranger", "--sign-key", strangerKey)
	refused("untrusted signer", "which this host does not trust", "template", "pull", regAddr.String()+":5000/templates/busybox:stranger", "--key", keyA)
	refused("a template pulled as a snapshot", "it is a template, not a snapshot", "snapshot", "pull", ref, "--key", keyA)
	flip.digest.Store(pushed.Layers[1].Digest) // memory
	refused("flipped byte in the memory layer", "memory layer: the blob does not match its signed digest", "template", "pull", ref, "--key", keyA)
	flip.digest.Store("")

	// The move. A cold start on B first, for the comparison.
	t0 := time.Now()
	b.run("agent", "create", "cold")
	t.Cleanup(func() { b.smx("agent", "rm", "-f", "cold") })
	b.run("agent", "start", "cold", "--cold")
	b.run("agent", "exec", "cold", "--", "true")
	cold := time.Since(t0)
	b.run("agent", "rm", "-f", "cold")
	b.run("template", "rm", "--all") // the cold start's own, were it saved

	t0 = time.Now()
	var pulled struct {
		Kind        string `json:"kind"`
		Snapshot    string `json:"snapshot"`
		ImageOnHost bool   `json:"image_on_host"`
	}
	json.Unmarshal([]byte(b.run("template", "pull", ref, "--key", keyA, "--json")), &pulled)
	if pulled.Kind != "template" || pulled.Snapshot != tpl || !pulled.ImageOnHost {
		t.Fatalf("pulled %+v, want template %s for an image B has", pulled, tpl)
	}
	tPull := time.Since(t0)
	b.run("agent", "create", "tpl-dst")
	t.Cleanup(func() { b.smx("agent", "rm", "-f", "tpl-dst") })
	b.run("agent", "start", "tpl-dst")
	b.run("agent", "exec", "tpl-dst", "--", "true")
	moved := time.Since(t0)
	t.Logf("on B: cold start to first exec %v; template pull %v, pull+start+first exec %v (%.2f of the cold start)", cold, tPull, moved, float64(moved)/float64(cold))

	var inspect struct {
		Spec struct {
			Template string `json:"template"`
		} `json:"spec"`
	}
	json.Unmarshal([]byte(b.run("agent", "inspect", "tpl-dst", "--json")), &inspect)
	if inspect.Spec.Template != tpl {
		t.Errorf("B's sandbox started from template %q, want the pulled %s", inspect.Spec.Template, tpl)
	}
	if _, err := os.Stat(filepath.Join(homeB, "templates", tpl, "ca.key")); err == nil {
		t.Errorf("B's copy of the template has a CA key")
	}
	ownCA, err := os.ReadFile(filepath.Join(homeB, "sandboxes", "tpl-dst", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(ownCA, cert) {
		t.Errorf("B's sandbox uses A's template CA")
	}
	guestCA := b.run("agent", "exec", "tpl-dst", "--", "cat", "/usr/local/share/ca-certificates/smx.crt")
	if strings.TrimSpace(guestCA) != strings.TrimSpace(string(ownCA)) {
		t.Errorf("B's guest trusts\n%s\nnot its sandbox's CA\n%s", guestCA, ownCA)
	}
	if bundle := b.run("agent", "exec", "tpl-dst", "--", "cat", "/etc/ssl/certs/ca-certificates.crt"); strings.Contains(bundle, strings.TrimSpace(string(cert))) {
		t.Errorf("B's guest still trusts A's template CA")
	}

	// A snapshot of B's sandbox moves on in turn: its disk chain ends at
	// the base that came with the template, which it names as its own.
	b.run("snapshot", "create", "tpl-dst", "--name", "onward")
	var onward struct {
		Layers []struct {
			Role string `json:"role"`
		} `json:"layers"`
	}
	json.Unmarshal([]byte(b.run("snapshot", "push", "onward", regAddr.String()+":5000/agents/onward:1", "--json")), &onward)
	roles = nil
	for _, l := range onward.Layers {
		roles = append(roles, l.Role)
	}
	if strings.Join(roles, ",") != "meta,memory,disk,backing,base,profile" {
		t.Errorf("B's snapshot of a sandbox started from the pulled template pushed as %v", roles)
	}

	// The supervisors ran in their hosts' namespaces.
	if got, want := a.supervisorNetNS("tpl-src"), fmt.Sprintf("net:[%d]", nsA.Inode(t)); got != want {
		t.Errorf("A's supervisor runs in %s, want A's namespace %s", got, want)
	}
	if got, want := b.supervisorNetNS("tpl-dst"), fmt.Sprintf("net:[%d]", nsB.Inode(t)); got != want {
		t.Errorf("B's supervisor runs in %s, want B's namespace %s", got, want)
	}
}
