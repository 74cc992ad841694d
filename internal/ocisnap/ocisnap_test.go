package ocisnap

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
)

const (
	testKernel = "6.1.0-99-amd64"
	testQEMU   = "QEMU emulator version 7.2.99"
)

// host is one simulated host: a state directory with a kernel in its
// cache and a log key.
type host struct {
	state  statedir.Dir
	signer note.Signer
	vkey   string
}

func newHost(t testing.TB, kernelBytes []byte) *host {
	t.Helper()
	st := statedir.Dir{Root: t.TempDir()}
	kdir := filepath.Join(st.Kernels(), testKernel)
	must(t, os.MkdirAll(filepath.Join(kdir, "lib", "modules", testKernel), 0o755))
	must(t, os.WriteFile(filepath.Join(kdir, "vmlinuz"), kernelBytes, 0o644))
	must(t, os.WriteFile(filepath.Join(kdir, "lib", "modules", testKernel, "modules.dep"), nil, 0o644))
	skey, vkey, err := note.GenerateKey(rand.Reader, "smx-audit")
	must(t, err)
	s, err := note.NewSigner(skey)
	must(t, err)
	return &host{state: st, signer: s, vkey: vkey}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func qemuImg(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img %v: %v: %s", args, err, out)
	}
}

// makeBase writes an image base qcow2 with some data in it.
func makeBase(t testing.TB, h *host) string {
	t.Helper()
	dir := filepath.Join(h.state.Images(), "busybox")
	must(t, os.MkdirAll(dir, 0o755))
	raw := filepath.Join(t.TempDir(), "base.raw")
	data := make([]byte, 4<<20)
	rand.Read(data[:1<<20])
	must(t, os.WriteFile(raw, data, 0o644))
	base := filepath.Join(dir, "base.qcow2")
	qemuImg(t, "convert", "-q", "-f", "raw", "-O", "qcow2", raw, base)
	return base
}

// makeSnapshot stores a snapshot as the supervisor would: a memory state
// (mostly zero pages and some noise), a disk overlay over base with a
// file's worth of writes, the frozen profile.
func makeSnapshot(t testing.TB, h *host, name, base string, noise []byte) *snapshot.Snapshot {
	return makeSnapshotOn(t, h, name, base, base, noise)
}

// makeTemplateDisk writes a boot template's disk layer over base, as the
// supervisor keeps it in the template store.
func makeTemplateDisk(t testing.TB, h *host, base string) string {
	dir := filepath.Join(h.state.Templates(), "tpl-test")
	must(t, os.MkdirAll(dir, 0o700))
	disk := filepath.Join(dir, "disk.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", disk)
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x33 1M 128k", disk).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	return disk
}

// makeSnapshotOn is makeSnapshot with the disk backed by backing (the
// image base or a template's disk over it).
func makeSnapshotOn(t testing.TB, h *host, name, backing, base string, noise []byte) *snapshot.Snapshot {
	t.Helper()
	store := &snapshot.Store{Dir: h.state.Snapshots()}
	b, err := store.Begin(name)
	must(t, err)
	mem := make([]byte, 8<<20)
	copy(mem[1<<20:], noise)
	must(t, os.WriteFile(b.MemoryPath(), mem, 0o600))
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", backing, "-F", "qcow2", b.DiskPath())
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 512k 64k", b.DiskPath()).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	must(t, os.WriteFile(b.ProfilePath(), []byte("name: locked\negress: deny-all\n"), 0o600))
	tpl := ""
	if backing != base {
		tpl = "tpl-test"
	}
	sn, err := b.Commit(snapshot.Snapshot{Source: "agent1", Template: tpl, Created: time.Now().UTC(), Image: "busybox", ImageBase: base,
		Host:    snapshot.Host{QEMUVersion: testQEMU, Kernel: testKernel, InitramfsHash: "sha256:abc", Accel: "tcg"},
		Profile: "locked", ProfileHash: "sha256:p", CPUs: 1, MemoryMiB: 256, DiskBytes: 4 << 20})
	must(t, err)
	return sn
}

// corrupter is a registry on loopback that can flip one byte of one blob
// as it is served, as a damaged or hostile registry would.
type corrupter struct {
	reg    http.Handler
	digest atomic.Value // string: the blob to corrupt
}

func (c *corrupter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d, _ := c.digest.Load().(string)
	if d == "" || r.Method != http.MethodGet || !strings.HasSuffix(r.URL.Path, "/blobs/"+d) {
		c.reg.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	c.reg.ServeHTTP(rec, r)
	body := rec.Body.Bytes()
	if len(body) > 100 {
		body[100] ^= 1
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(body)
}

func newRegistry(t testing.TB) (*corrupter, string) {
	c := &corrupter{reg: registry.New(registry.Logger(nilLogger()))}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return c, strings.TrimPrefix(srv.URL, "http://")
}

// tree lists every path under dir with its size, to show a refused pull
// changed nothing (the store's lock file aside).
func tree(t testing.TB, dir string) string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || filepath.Base(p) == ".lock" {
			return nil
		}
		fi, _ := d.Info()
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			out = append(out, rel+"/")
		} else {
			out = append(out, rel+" "+fi.Mode().String())
		}
		return nil
	})
	sort.Strings(out)
	return strings.Join(out, "\n")
}

func verifiersOf(t testing.TB, keys ...string) note.Verifiers {
	v, _, err := Verifiers(keys...)
	must(t, err)
	return v
}

func TestPushPullAcrossHosts(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	ctx := context.Background()
	kernelBytes := []byte("a kernel image")
	a, b := newHost(t, kernelBytes), newHost(t, kernelBytes)
	_, reg := newRegistry(t)
	base := makeBase(t, a)
	sn := makeSnapshot(t, a, "snap1", base, []byte("first"))

	r1, err := Push(ctx, PushOptions{State: a.state, Snapshot: sn, Ref: reg + "/agents/a1:one", Signer: a.signer})
	must(t, err)
	if r1.BytesSent != r1.BytesTotal {
		t.Errorf("first push sent %d of %d bytes; want all", r1.BytesSent, r1.BytesTotal)
	}
	if r1.MemoryStored >= r1.MemoryBytes {
		t.Errorf("memory layer %d bytes for %d bytes of state: zstd did not pay", r1.MemoryStored, r1.MemoryBytes)
	}

	got, pr, err := Pull(ctx, PullOptions{State: b.state, Ref: reg + "/agents/a1:one", Name: "moved",
		Verifiers: verifiersOf(t, a.vkey), QEMUVersion: testQEMU})
	must(t, err)
	if pr.Digest != r1.Digest || got.Name != "moved" {
		t.Errorf("pulled %+v, pushed %s", pr, r1.Digest)
	}
	bStore := &snapshot.Store{Dir: b.state.Snapshots()}
	must(t, bStore.Verify(got))
	for _, f := range []struct{ a, b string }{{sn.MemoryPath(), got.MemoryPath()}, {sn.ProfilePath(), got.ProfilePath()}} {
		x, _ := os.ReadFile(f.a)
		y, _ := os.ReadFile(f.b)
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs after the move", filepath.Base(f.b))
		}
	}
	// The guest's disk (overlay and base together) reads the same.
	qemuImg(t, "compare", "-q", sn.DiskPath(), got.DiskPath())
	if got.Origin == nil || got.Origin.DiskDigest != sn.DiskDigest || got.ImageBase != filepath.Join(got.Dir, baseFile) {
		t.Errorf("origin %+v, image base %s", got.Origin, got.ImageBase)
	}
	if got.MemoryDigest != sn.MemoryDigest || got.ProfileHash != sn.ProfileHash || got.Kernel != testKernel {
		t.Errorf("pulled metadata %+v", got)
	}

	// A second snapshot of the same sandbox: the base is not sent again.
	sn2 := makeSnapshot(t, a, "snap2", base, []byte("second"))
	r2, err := Push(ctx, PushOptions{State: a.state, Snapshot: sn2, Ref: reg + "/agents/a1:two", Signer: a.signer})
	must(t, err)
	for _, l := range r2.Layers {
		if l.Role == RoleBase && l.Sent {
			t.Errorf("second push sent the base layer again")
		}
	}
	if r2.BytesSent >= r1.BytesSent {
		t.Errorf("second push sent %d bytes, first %d: no dedup", r2.BytesSent, r1.BytesSent)
	}
	t.Logf("first push %d of %d bytes, second %d of %d; memory %d -> %d bytes (zstd) in %d ms",
		r1.BytesSent, r1.BytesTotal, r2.BytesSent, r2.BytesTotal, r1.MemoryBytes, r1.MemoryStored, r1.CompressMS)

	// A sandbox started from a boot template: its disk chain runs through
	// the template's disk, which travels as a backing layer, once.
	tdisk := makeTemplateDisk(t, a, base)
	st1 := makeSnapshotOn(t, a, "tsnap1", tdisk, base, []byte("t1"))
	rt1, err := Push(ctx, PushOptions{State: a.state, Snapshot: st1, Ref: reg + "/agents/t:1", Signer: a.signer})
	must(t, err)
	gt, _, err := Pull(ctx, PullOptions{State: b.state, Ref: reg + "/agents/t:1", Verifiers: verifiersOf(t, a.vkey), QEMUVersion: testQEMU})
	must(t, err)
	qemuImg(t, "compare", "-q", st1.DiskPath(), gt.DiskPath())
	if gt.Template != "" || gt.Parent != "" {
		t.Errorf("pulled snapshot still depends on template %q / parent %q of the sending host", gt.Template, gt.Parent)
	}
	st2 := makeSnapshotOn(t, a, "tsnap2", tdisk, base, []byte("t2"))
	rt2, err := Push(ctx, PushOptions{State: a.state, Snapshot: st2, Ref: reg + "/agents/t:2", Signer: a.signer})
	must(t, err)
	var backings int
	for i, l := range rt2.Layers {
		if l.Role == RoleBacking {
			backings++
			if l.Sent || !rt1.Layers[i].Sent {
				t.Errorf("template layer sent %v the first time, %v the second", rt1.Layers[i].Sent, l.Sent)
			}
		}
	}
	if backings != 1 {
		t.Errorf("%d backing layers, want the template's", backings)
	}

	// Pushed without compression, the memory layer is the file itself.
	r3, err := Push(ctx, PushOptions{State: a.state, Snapshot: sn2, Ref: reg + "/agents/a1:raw", Signer: a.signer, Compress: CompressNone})
	must(t, err)
	if r3.MemoryStored != r3.MemoryBytes {
		t.Errorf("uncompressed memory layer is %d bytes, state %d", r3.MemoryStored, r3.MemoryBytes)
	}
	if _, _, err := Pull(ctx, PullOptions{State: b.state, Ref: reg + "/agents/a1:raw", Name: "raw",
		Verifiers: verifiersOf(t, a.vkey), QEMUVersion: testQEMU}); err != nil {
		t.Fatal(err)
	}
}

// resign pushes a copy of the artifact at src to dst with its meta
// changed by edit and signed by signer.
func resign(t testing.TB, src, dst string, signer note.Signer, edit func(*Meta)) {
	t.Helper()
	img, err := remote.Image(mustRef(t, src))
	must(t, err)
	layers, err := img.Layers()
	must(t, err)
	rc, err := layers[0].Compressed()
	must(t, err)
	raw, _ := io.ReadAll(rc)
	rc.Close()
	var meta Meta
	must(t, json.Unmarshal(raw, &meta))
	edit(&meta)
	nb, _ := json.Marshal(meta)
	out := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), ArtifactType)
	adds := []mutate.Addendum{{Layer: static.NewLayer(nb, MetaType), MediaType: MetaType}}
	for _, l := range layers[1:] {
		mt, _ := l.MediaType()
		adds = append(adds, mutate.Addendum{Layer: l, MediaType: mt})
	}
	out, err = mutate.Append(out, adds...)
	must(t, err)
	sig, err := sign(digestOf(nb), signer)
	must(t, err)
	out = mutate.Annotations(out, map[string]string{SignatureAnnot: sig}).(v1.Image)
	must(t, remote.Write(mustRef(t, dst), out))
}

func mustRef(t testing.TB, s string) name.Reference {
	r, err := name.ParseReference(s)
	must(t, err)
	return r
}

func TestPullRefusesWhatItCannotVerify(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	ctx := context.Background()
	a, b := newHost(t, []byte("kernel")), newHost(t, []byte("kernel"))
	stranger := newHost(t, []byte("kernel"))
	reg, addr := newRegistry(t)
	sn := makeSnapshot(t, a, "snap1", makeBase(t, a), []byte("x"))
	good := addr + "/agents/a1:good"
	r, err := Push(ctx, PushOptions{State: a.state, Snapshot: sn, Ref: good, Signer: a.signer})
	must(t, err)
	var memDigest string
	for _, l := range r.Layers {
		if l.Role == RoleMemory {
			memDigest = l.Digest
		}
	}

	resign(t, good, addr+"/agents/a1:stranger", stranger.signer, func(*Meta) {})
	resign(t, good, addr+"/agents/a1:kernel", a.signer, func(m *Meta) { m.KernelDigest = digestOf([]byte("another kernel")) })
	resign(t, good, addr+"/agents/a1:mounts", a.signer, func(m *Meta) { m.Snapshot.Mounts = []string{"/etc:/mnt"} })
	// An edit after signing: the meta no longer matches the signature.
	{
		img, _ := remote.Image(mustRef(t, good))
		m, _ := img.Manifest()
		sig := m.Annotations[SignatureAnnot]
		resign(t, good, addr+"/agents/a1:edited", a.signer, func(m *Meta) { m.Snapshot.ProfileHash = "sha256:other" })
		img2, _ := remote.Image(mustRef(t, addr+"/agents/a1:edited"))
		img2 = mutate.Annotations(img2, map[string]string{SignatureAnnot: sig}).(v1.Image)
		must(t, remote.Write(mustRef(t, addr+"/agents/a1:edited"), img2))
	}

	before := tree(t, b.state.Root)
	for _, tc := range []struct {
		name, ref, want string
		qemu            string
		class           error
		corrupt         string
	}{
		{name: "untrusted signer", ref: addr + "/agents/a1:stranger", want: "which this host does not trust", class: errdefs.ErrDenied},
		{name: "meta edited after signing", ref: addr + "/agents/a1:edited", want: "is not the one signed", class: errdefs.ErrDenied},
		{name: "another kernel", ref: addr + "/agents/a1:kernel", want: "this host lacks guest kernel " + testKernel + " with digest", class: errdefs.ErrFailed},
		{name: "mounts of the sending host", ref: addr + "/agents/a1:mounts", want: "may not name this host's folders", class: errdefs.ErrDenied},
		{name: "another QEMU", ref: good, qemu: "QEMU emulator version 10.0.2", want: `this host lacks QEMU "` + testQEMU, class: errdefs.ErrFailed},
		{name: "flipped byte in the memory layer", ref: good, corrupt: memDigest, want: "memory layer: the blob does not match its signed digest", class: errdefs.ErrDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg.digest.Store(tc.corrupt)
			defer reg.digest.Store("")
			q := tc.qemu
			if q == "" {
				q = testQEMU
			}
			_, _, err := Pull(ctx, PullOptions{State: b.state, Ref: tc.ref, Verifiers: verifiersOf(t, a.vkey), QEMUVersion: q})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("pull: %v; want an error saying %q", err, tc.want)
			}
			if !errors.Is(err, tc.class) {
				t.Errorf("pull: %v; want class %v", err, tc.class)
			}
			if after := tree(t, b.state.Root); after != before {
				t.Errorf("a refused pull changed the state directory:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	// The untampered artifact pulls, so the refusals above were about the tampering.
	if _, _, err := Pull(ctx, PullOptions{State: b.state, Ref: good, Verifiers: verifiersOf(t, a.vkey), QEMUVersion: testQEMU}); err != nil {
		t.Fatal(err)
	}
}

func nilLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// TestPullInstallsTheKernelItLacks: a host without the snapshot's kernel
// refuses it, saying so, unless the artifact carries the kernel; then the
// pull installs it, only if its bzImage has the signed digest.
func TestPullInstallsTheKernelItLacks(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	ctx := context.Background()
	a := newHost(t, []byte("the kernel"))
	bare := newHost(t, nil)
	must(t, os.RemoveAll(bare.state.Kernels()))
	must(t, os.MkdirAll(bare.state.Kernels(), 0o755))
	_, reg := newRegistry(t)
	sn := makeSnapshot(t, a, "snap1", makeBase(t, a), []byte("k"))
	_, err := Push(ctx, PushOptions{State: a.state, Snapshot: sn, Ref: reg + "/agents/k:plain", Signer: a.signer})
	must(t, err)
	pull := func(ref string) error {
		_, _, err := Pull(ctx, PullOptions{State: bare.state, Ref: ref, Verifiers: verifiersOf(t, a.vkey), QEMUVersion: testQEMU})
		return err
	}
	before := tree(t, bare.state.Root)
	if err := pull(reg + "/agents/k:plain"); err == nil || !strings.Contains(err.Error(), "this host lacks guest kernel "+testKernel+" (sha256:") {
		t.Fatalf("pull without the kernel: %v", err)
	}
	rk, err := Push(ctx, PushOptions{State: a.state, Snapshot: sn, Ref: reg + "/agents/k:with", Signer: a.signer, WithKernel: true})
	must(t, err)
	for _, l := range rk.Layers {
		if l.Sent != (l.Role == "meta" || l.Role == RoleKernel) {
			t.Errorf("pushing again with the kernel: %s layer sent %v", l.Role, l.Sent)
		}
	}
	resign(t, reg+"/agents/k:with", reg+"/agents/k:badkernel", a.signer, func(m *Meta) { m.KernelDigest = digestOf([]byte("other")) })
	if err := pull(reg + "/agents/k:badkernel"); err == nil || !strings.Contains(err.Error(), "its bzImage is") {
		t.Fatalf("pull of a kernel layer that is not the signed kernel: %v", err)
	}
	if after := tree(t, bare.state.Root); after != before {
		t.Fatalf("a refused pull changed the state directory:\n%s\n---\n%s", before, after)
	}
	must(t, pull(reg+"/agents/k:with"))
	got, err := os.ReadFile(filepath.Join(bare.state.Kernels(), testKernel, "vmlinuz"))
	if err != nil || string(got) != "the kernel" {
		t.Fatalf("installed kernel: %q, %v", got, err)
	}
}

// TestPushRefusesACorruptSnapshot: a memory state changed since the
// snapshot was taken is not sent anywhere.
func TestPushRefusesACorruptSnapshot(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	a := newHost(t, []byte("kernel"))
	_, reg := newRegistry(t)
	sn := makeSnapshot(t, a, "snap1", makeBase(t, a), []byte("x"))
	must(t, os.Chmod(sn.MemoryPath(), 0o644))
	f, err := os.OpenFile(sn.MemoryPath(), os.O_WRONLY, 0)
	must(t, err)
	f.WriteAt([]byte{1}, 4096)
	f.Close()
	for _, c := range []string{CompressZstd, CompressNone} {
		_, err := Push(context.Background(), PushOptions{State: a.state, Snapshot: sn, Ref: reg + "/agents/c:" + c, Signer: a.signer, Compress: c})
		if err == nil || !strings.Contains(err.Error(), "memory layer does not match its digest") {
			t.Errorf("push %s of a corrupt snapshot: %v", c, err)
		}
	}
}
