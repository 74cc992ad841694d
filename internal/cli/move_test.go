package cli_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/ocisnap"
	"github.com/smx-dev/smx/internal/testutil"
)

// flipRegistry is a registry on loopback that flips one byte of one blob
// as it serves it, when told which.
type flipRegistry struct {
	reg    http.Handler
	digest atomic.Value
}

func (f *flipRegistry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d, _ := f.digest.Load().(string)
	if d == "" || r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+d) {
		f.reg.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	f.reg.ServeHTTP(rec, r)
	body := rec.Body.Bytes()
	if len(body) > 4096 {
		body[4096] ^= 0x20
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(body)
}

// stateTree lists a state directory (paths and modes; lock files and the
// key pins aside), to show that a refused pull changed nothing.
func stateTree(t *testing.T, dir string) string {
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || strings.HasSuffix(p, ".lock") {
			return nil
		}
		if d.Type()&fs.ModeSymlink != 0 {
			out = append(out, p+" ->")
			return nil
		}
		fi, _ := d.Info()
		out = append(out, fmt.Sprintf("%s %v %d", strings.TrimPrefix(p, dir), fi.Mode(), fi.Size()))
		return nil
	})
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// TestSnapshotMovesBetweenHosts: two hosts are two state directories on
// this machine, each with its CLI (and so its supervisors and QEMUs) in a
// network namespace of its own; the registry is go-containerregistry's,
// in a third, which both reach and the test reads through a loopback
// listener of its own. A
// sandbox with a running counter, a file on its disk and a brokered
// credential is snapshotted on A, pushed, pulled on B and restored there:
// the counter continues, the file is intact, the profile is the frozen
// one, the credential's value is in no layer, and A's and B's logs verify
// as one chain. A flipped byte, an untrusted signer and another kernel are
// each refused with B's state directory unchanged.
func TestSnapshotMovesBetweenHosts(t *testing.T) {
	testutil.RequireQEMU(t)
	bin := testutil.Binaries(t)
	kernels := testutil.KernelCache(t)

	testutil.RequireNetNS(t)
	flip := &flipRegistry{reg: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	nsReg, nsA, nsB := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
	regAddr := nsReg.Reach(t, nsA, nsB)
	srv := &http.Server{Handler: flip}
	go srv.Serve(nsReg.Listen(t, "tcp", regAddr.String()+":5000"))
	defer srv.Close()
	reg := regAddr.String() + ":5000"
	direct := httptest.NewServer(flip)
	defer direct.Close()

	homeA, homeB := t.TempDir(), t.TempDir()
	os.Symlink(kernels, filepath.Join(homeA, "kernels"))
	os.Symlink(kernels, filepath.Join(homeB, "kernels"))
	a := &vmEnv{t: t, bin: bin, home: homeA, name: "mv-src", ns: nsA}
	b := &vmEnv{t: t, bin: bin, home: homeB, name: "mv-dst", ns: nsB}
	run := func(v *vmEnv, args ...string) string {
		t.Helper()
		out, err := v.smx(args...)
		if err != nil {
			t.Fatalf("smx %v: %v\n%s", args, err, out)
		}
		return out
	}
	run(a, "image", "build", "busybox")

	const secret = "sk-move-3f9c2e7a1d5b8046"
	set := a.cmd("creds", "set", "model-key")
	set.Stdin = strings.NewReader(secret)
	if out, err := set.CombinedOutput(); err != nil {
		t.Fatalf("creds set: %v\n%s", err, out)
	}
	profile := filepath.Join(t.TempDir(), "model.yaml")
	os.WriteFile(profile, []byte(`network:
  mode: default-deny
  allow:
    - domain: api.model.test
credentials:
  - name: model
    from: model-key
    domain: api.model.test
    header: x-api-key
`), 0o644)
	run(a, "agent", "create", a.name, "--memory", "256M", "--profile", profile, "-e", "MODEL_API_KEY=smx-placeholder")
	t.Cleanup(func() { a.smx("agent", "rm", "-f", a.name) })
	t0 := time.Now()
	run(a, "agent", "start", a.name)
	coldStart := time.Since(t0)
	counter := `setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done' </dev/null >/dev/null 2>&1 &`
	run(a, "agent", "exec", a.name, "--", "sh", "-c", counter+" echo kept-on-disk > /root/data.txt; sync")
	run(a, "snapshot", "create", a.name, "--name", "mv-snap")
	var snapA struct {
		ProfileHash string `json:"profile_hash"`
	}
	json.Unmarshal([]byte(run(a, "snapshot", "inspect", "mv-snap", "--json")), &snapA)

	keyA := filepath.Join(t.TempDir(), "a.pub")
	os.WriteFile(keyA, []byte(run(a, "logs", "export-key")), 0o644)

	type pushResult struct {
		Digest       string `json:"digest"`
		BytesSent    int64  `json:"bytes_sent"`
		BytesTotal   int64  `json:"bytes_total"`
		MemoryBytes  int64  `json:"memory_bytes"`
		MemoryStored int64  `json:"memory_stored"`
		CompressMS   int64  `json:"compress_ms"`
		DurationMS   int64  `json:"duration_ms"`
		Layers       []struct {
			Role   string `json:"role"`
			Digest string `json:"digest"`
			Sent   bool   `json:"sent"`
		} `json:"layers"`
	}
	push := func(snap, ref string, extra ...string) pushResult {
		t.Helper()
		var r pushResult
		if err := json.Unmarshal([]byte(run(a, append([]string{"snapshot", "push", snap, ref, "--json"}, extra...)...)), &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	ref := reg + "/agents/mv:1"
	r1 := push("mv-snap", ref)
	if r1.BytesSent != r1.BytesTotal || r1.MemoryStored >= r1.MemoryBytes {
		t.Fatalf("first push: %+v", r1)
	}
	// The memory state without compression, for the record.
	rRaw := push("mv-snap", reg+"/agents/mv:raw", "--compress", "none")
	// A second snapshot of the same sandbox: the base disk is not re-sent.
	run(a, "snapshot", "create", a.name, "--name", "mv-snap2")
	r2 := push("mv-snap2", reg+"/agents/mv:2")
	for _, l := range r2.Layers {
		if l.Role == "base" && l.Sent {
			t.Errorf("the second push sent the base disk again")
		}
	}
	if r2.BytesSent >= r1.BytesSent {
		t.Errorf("second push sent %d bytes, the first %d", r2.BytesSent, r1.BytesSent)
	}
	t.Logf("memory state %d bytes, zstd %d (%.2f) in %d ms; push zstd %d ms, none %d ms; first push sent %d bytes, second %d (%.2f)",
		r1.MemoryBytes, r1.MemoryStored, float64(r1.MemoryStored)/float64(r1.MemoryBytes), r1.CompressMS, r1.DurationMS, rRaw.DurationMS,
		r1.BytesSent, r2.BytesSent, float64(r2.BytesSent)/float64(r1.BytesSent))

	// No layer holds the credential's value.
	img, err := remote.Image(mustParse(t, strings.TrimPrefix(direct.URL, "http://")+"/agents/mv:1"))
	if err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	for _, l := range layers {
		rc, _ := l.Compressed()
		blob, _ := io.ReadAll(rc)
		rc.Close()
		if mt, _ := l.MediaType(); string(mt) == ocisnap.MemoryZstdType {
			dec, _ := zstd.NewReader(nil)
			blob, err = dec.DecodeAll(blob, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(blob, []byte("kept-on-disk")) && !bytes.Contains(blob, []byte("MODEL_API_KEY=smx-placeholder")) {
				t.Errorf("the memory layer does not hold what the guest holds: the scan would prove nothing")
			}
		}
		if bytes.Contains(blob, []byte(secret)) {
			mt, _ := l.MediaType()
			t.Errorf("layer %s holds the credential's value", mt)
		}
	}

	// Refusals, each leaving B's state directory as it was.
	before := stateTree(t, homeB)
	refused := func(what, want string, args ...string) {
		t.Helper()
		out, err := b.smx(args...)
		// Progress lines aside, the refusal is one line.
		lines := strings.Split(strings.TrimSpace(out), "\n")
		last := lines[len(lines)-1]
		t.Logf("%s: %s", what, last)
		if err == nil || !strings.Contains(last, want) || !strings.HasPrefix(last, "smx: pull ") {
			t.Errorf("%s: %v\n%s\nwant %q", what, err, out, want)
		}
		if after := stateTree(t, homeB); after != before {
			t.Errorf("%s changed B's state directory:\n%s\n---\n%s", what, before, after)
		}
	}
	refused("no trusted key", "trusts no signing key", "snapshot", "pull", ref)
	strangerKey, strangerPub := newNoteKey(t)
	push("mv-snap", reg+"/agents/mv:stranger", "--sign-key", strangerKey)
	refused("untrusted signer", "which this host does not trust", "snapshot", "pull", reg+"/agents/mv:stranger", "--key", keyA)
	// A stranger's key trusted does not make A's signature trusted either.
	refused("signed by A, trusting only the stranger", "which this host does not trust", "snapshot", "pull", ref, "--key", strangerPub)
	for _, l := range r1.Layers {
		if l.Role == "memory" {
			flip.digest.Store(l.Digest)
		}
	}
	refused("flipped byte in the memory layer", "memory layer: the blob does not match its signed digest", "snapshot", "pull", ref, "--key", keyA)
	flip.digest.Store("")
	// Host C has a kernel of the same version with other contents.
	homeC := t.TempDir()
	c := &vmEnv{t: t, bin: bin, home: homeC, ns: nsB}
	ents, _ := os.ReadDir(kernels)
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		kd := filepath.Join(homeC, "kernels", e.Name())
		os.MkdirAll(filepath.Join(kd, "lib", "modules", e.Name()), 0o755)
		os.WriteFile(filepath.Join(kd, "vmlinuz"), []byte("another kernel"), 0o644)
		os.WriteFile(filepath.Join(kd, "lib", "modules", e.Name(), "modules.dep"), nil, 0o644)
	}
	beforeC := stateTree(t, homeC)
	if out, err := c.smx("snapshot", "pull", ref, "--key", keyA); err == nil || !strings.Contains(out, "this host lacks guest kernel") || !strings.Contains(out, "with digest") {
		t.Errorf("pull onto a host with another kernel: %v\n%s", err, out)
	}
	if stateTree(t, homeC) != beforeC {
		t.Errorf("a refused pull changed C's state directory")
	}

	// The move itself.
	t0 = time.Now()
	run(b, "snapshot", "pull", ref, "--key", keyA, "--name", "arrived")
	pulled := time.Since(t0)
	run(b, "agent", "restore", "arrived", "--name", b.name)
	t.Cleanup(func() { b.smx("agent", "rm", "-f", b.name) })
	run(b, "agent", "exec", b.name, "--", "true")
	restored := time.Since(t0)
	t.Logf("cold start on A %v; on B pull %v, pull+restore+first exec %v (%.2f of the cold start)", coldStart, pulled, restored, float64(restored)/float64(coldStart))
	out := run(b, "agent", "exec", b.name, "--", "sh", "-c", "cat /root/data.txt; a=$(cat /tmp/count); sleep 0.5; c=$(cat /tmp/count); [ $c -gt $a ] && echo counting $a $c")
	if !strings.Contains(out, "kept-on-disk") || !strings.Contains(out, "counting") {
		t.Fatalf("restored on B:\n%s", out)
	}
	if out := run(b, "agent", "inspect", b.name, "--json"); snapA.ProfileHash == "" || !strings.Contains(out, snapA.ProfileHash) {
		t.Errorf("B's sandbox does not run the frozen profile %q:\n%s", snapA.ProfileHash, out)
	}

	// Host D has no kernel at all: the artifact brings it along.
	homeD := t.TempDir()
	os.MkdirAll(filepath.Join(homeD, "kernels"), 0o755)
	d := &vmEnv{t: t, bin: bin, home: homeD, name: "mv-kern", ns: nsB}
	push("mv-snap", reg+"/agents/mv:kernel", "--with-kernel")
	if out, err := d.smx("snapshot", "pull", ref, "--key", keyA); err == nil || !strings.Contains(out, "--with-kernel") {
		t.Errorf("pull onto a host without the kernel: %v\n%s", err, out)
	}
	run(d, "snapshot", "pull", reg+"/agents/mv:kernel", "--key", keyA)
	run(d, "agent", "restore", "mv-snap", "--name", d.name)
	t.Cleanup(func() { d.smx("agent", "rm", "-f", d.name) })
	if out := run(d, "agent", "exec", d.name, "--", "sh", "-c", "cat /root/data.txt; a=$(cat /tmp/count); sleep 0.5; c=$(cat /tmp/count); [ $c -gt $a ] && echo counting"); !strings.Contains(out, "counting") {
		t.Errorf("restored on D:\n%s", out)
	}
	run(d, "agent", "rm", "-f", d.name)

	// The logs: A's and B's verify as one chain.
	// The two hosts' supervisors run apart.
	if na, nb := supervisorNetNS(t, homeA, a.name), supervisorNetNS(t, homeB, b.name); na != fmt.Sprintf("net:[%d]", nsA.Inode(t)) || nb != fmt.Sprintf("net:[%d]", nsB.Inode(t)) {
		t.Errorf("supervisors ran in %s and %s, not in A's and B's namespaces", na, nb)
	}
	run(a, "agent", "stop", a.name)
	run(b, "agent", "stop", b.name)
	dir := t.TempDir()
	bundleA, bundleB := filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")
	run(a, "logs", "export", a.name, "-o", bundleA)
	run(b, "logs", "export", b.name, "-o", bundleB)
	out = run(b, "logs", "verify", bundleA, bundleB, "--key", keyA)
	t.Logf("logs verify:\n%s", out)
	if !strings.Contains(out, "continues "+a.name+" record") || !strings.Contains(out, "verified\n") {
		t.Errorf("logs verify:\n%s", out)
	}
	if out, err := b.smx("logs", "verify", bundleB); err == nil || !strings.Contains(out, "not among the bundles given") {
		t.Errorf("B's log verified without A's: %v\n%s", err, out)
	}
}

func mustParse(t *testing.T, s string) name.Reference {
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newNoteKey writes a fresh signer key and its public key to files.
func newNoteKey(t *testing.T) (signerFile, pubFile string) {
	skey, vkey, err := note.GenerateKey(rand.Reader, "smx-audit")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	signerFile, pubFile = filepath.Join(dir, "key"), filepath.Join(dir, "key.pub")
	os.WriteFile(signerFile, []byte(skey+"\n"), 0o600)
	os.WriteFile(pubFile, []byte(vkey+"\n"), 0o644)
	return
}
