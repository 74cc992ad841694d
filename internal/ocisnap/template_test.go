package ocisnap

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/klauspost/compress/zstd"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/sshgw"
	"github.com/smx-dev/smx/internal/tlsgw"
)

// makeTemplate stores a boot template as the supervisor saves one: its
// memory state (which, like a real one, holds the gateway CA's
// certificate the guest was made to trust), its disk over the image base,
// and beside them the template's gateway CA and SSH host CA with their
// private keys.
func makeTemplate(t testing.TB, h *host, name, base string) *snapshot.Snapshot {
	t.Helper()
	store := &snapshot.Store{Dir: h.state.Templates()}
	b, err := store.Begin(name)
	must(t, err)
	ca, err := tlsgw.LoadOrCreate(b.Dir, "smx boot template")
	must(t, err)
	_, err = sshgw.LoadOrCreateCA(filepath.Join(b.Dir, sshgw.HostCAFile), "smx-boot-template")
	must(t, err)
	mem := make([]byte, 8<<20)
	copy(mem[2<<20:], ca.CertPEM())
	must(t, os.WriteFile(b.MemoryPath(), mem, 0o600))
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", base, "-F", "qcow2", b.DiskPath())
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x44 256k 64k", b.DiskPath()).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v: %s", err, out)
	}
	sn, err := b.Commit(snapshot.Snapshot{Source: "smx-first", Created: time.Now().UTC(), Image: "busybox", ImageDigest: "sha256:tree", ImageBase: base,
		Host: snapshot.Host{QEMUVersion: testQEMU, Kernel: testKernel, InitramfsHash: "abc", Accel: "tcg", Machine: "microvm", CPU: "max,-erms,-fsrm"},
		CPUs: 1, MemoryMiB: 256, DiskBytes: 4 << 20})
	must(t, err)
	return sn
}

// secrets are byte strings each of which would show a private key of the
// template's directory: each key file whole, the DER it encodes, and
// every line of its base64 body.
func secrets(t testing.TB, dir string) [][]byte {
	t.Helper()
	var out [][]byte
	for _, f := range []string{tlsgw.KeyFile, sshgw.HostCAFile} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		must(t, err)
		out = append(out, b)
		blk, _ := pem.Decode(b)
		if blk == nil {
			t.Fatalf("%s is not PEM", f)
		}
		out = append(out, blk.Bytes)
		for _, line := range strings.Split(string(b), "\n") {
			if len(line) >= 32 && !strings.HasPrefix(line, "-----") {
				out = append(out, []byte(line))
			}
		}
		// The DER split where a base64 line would not be.
		out = append(out, []byte(base64.StdEncoding.EncodeToString(blk.Bytes))[8:40])
	}
	return out
}

// TestTemplateMovesWithoutItsKeys: a boot template pushed from host A and
// pulled on host B arrives whole (memory, disk over its own copy of the
// base) and signed, but without the gateway CAs' private keys A keeps
// beside it: no blob of the artifact holds a byte of them. B's sandboxes
// then make CAs of their own, and their guests are made to trust those
// (replacing the template's) on restore. A template pulled again is
// there already; one pulled as a snapshot, or a snapshot as a template,
// is refused, as is a damaged one, each leaving nothing behind.
func TestTemplateMovesWithoutItsKeys(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("qemu-img not installed")
	}
	ctx := context.Background()
	a, b := newHost(t, []byte("kernel")), newHost(t, []byte("kernel"))
	reg, addr := newRegistry(t)
	base := makeBase(t, a)
	tpl := makeTemplate(t, a, "tpl-0123456789abcdef0123", base)
	ref := addr + "/templates/busybox:1"
	r, err := Push(ctx, PushOptions{State: a.state, Snapshot: tpl, Ref: ref, Signer: a.signer, Template: true})
	must(t, err)
	if r.Kind != KindTemplate {
		t.Errorf("push kind %q", r.Kind)
	}
	var roles []string
	var memDigest string
	for _, l := range r.Layers {
		roles = append(roles, l.Role)
		if l.Role == RoleMemory {
			memDigest = l.Digest
		}
	}
	if got := strings.Join(roles, ","); got != "meta,memory,disk,base" {
		t.Errorf("template layers %s, want meta,memory,disk,base", got)
	}

	// No blob holds a private key; the memory layer, decompressed, holds
	// the CA certificate, so the scan reads what the guest holds.
	needles := secrets(t, tpl.Dir)
	img, err := remote.Image(mustRef(t, ref))
	must(t, err)
	layers, err := img.Layers()
	must(t, err)
	cfg, _ := img.RawConfigFile()
	man, _ := img.RawManifest()
	blobs := [][]byte{cfg, man}
	sawCert := false
	cert, _ := os.ReadFile(filepath.Join(tpl.Dir, tlsgw.CertFile))
	for _, l := range layers {
		rc, err := l.Compressed()
		must(t, err)
		blob, _ := io.ReadAll(rc)
		rc.Close()
		blobs = append(blobs, blob)
		if mt, _ := l.MediaType(); string(mt) == MemoryZstdType {
			dec, _ := zstd.NewReader(nil)
			raw, err := dec.DecodeAll(blob, nil)
			must(t, err)
			sawCert = bytes.Contains(raw, cert)
			blobs = append(blobs, raw)
		}
	}
	if !sawCert {
		t.Fatalf("the memory layer does not hold the CA certificate the template's memory holds: the scan proves nothing")
	}
	for i, blob := range blobs {
		for _, n := range needles {
			if bytes.Contains(blob, n) {
				t.Errorf("blob %d holds private key bytes %q", i, n[:min(len(n), 24)])
			}
		}
	}

	// Refusals first, each leaving B's state directory as it was.
	snapRef := addr + "/agents/s:1"
	_, err = Push(ctx, PushOptions{State: a.state, Snapshot: makeSnapshot(t, a, "snap1", base, []byte("s")), Ref: snapRef, Signer: a.signer})
	must(t, err)
	resign(t, ref, addr+"/templates/busybox:kvm", a.signer, func(m *Meta) {
		m.Snapshot.Accel, m.Snapshot.CPU, m.Snapshot.CPUFlags = "kvm", "host", []string{"avx512f", "fpu", "sse2"}
	})
	resign(t, ref, addr+"/templates/busybox:kernel", a.signer, func(m *Meta) { m.KernelDigest = digestOf([]byte("another kernel")) })
	before := tree(t, b.state.Root)
	kvmHost := &snapshot.Host{Accel: "kvm", Machine: "microvm", CPU: "host", CPUFlags: []string{"fpu", "sse2"}}
	tcgHost := &snapshot.Host{Accel: "tcg", Machine: "microvm", CPU: "max"}
	for _, tc := range []struct {
		name, ref, want string
		template        bool
		cpu             *snapshot.Host
		corrupt         string
		class           error
	}{
		{name: "a snapshot pulled as a template", ref: snapRef, template: true, want: "it is a snapshot, not a template: use `smx snapshot pull`", class: errdefs.ErrInvalid},
		{name: "a template pulled as a snapshot", ref: ref, want: "it is a template, not a snapshot: use `smx template pull`", class: errdefs.ErrInvalid},
		{name: "flipped byte in the memory layer", ref: ref, template: true, corrupt: memDigest, want: "memory layer: the blob does not match its signed digest", class: errdefs.ErrDenied},
		{name: "CPU features this host lacks", ref: addr + "/templates/busybox:kvm", template: true, cpu: kvmHost, want: "this host lacks CPU features avx512f", class: errdefs.ErrFailed},
		{name: "another emulated CPU model", ref: ref, template: true, cpu: tcgHost, want: `this host lacks CPU model "max,-erms,-fsrm" under tcg`, class: errdefs.ErrFailed},
		{name: "another kernel", ref: addr + "/templates/busybox:kernel", template: true, want: "this host lacks guest kernel " + testKernel + " with digest", class: errdefs.ErrFailed},
		{name: "another accelerator", ref: ref, template: true, cpu: kvmHost, want: "this host lacks the accelerator tcg", class: errdefs.ErrFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg.digest.Store(tc.corrupt)
			defer reg.digest.Store("")
			_, _, err := Pull(ctx, PullOptions{State: b.state, Ref: tc.ref, Verifiers: verifiersOf(t, a.vkey), QEMUVersion: testQEMU, Template: tc.template, HostCPU: tc.cpu})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.class) {
				t.Fatalf("pull: %v; want %v saying %q", err, tc.class, tc.want)
			}
			if after := tree(t, b.state.Root); after != before {
				t.Errorf("a refused pull changed the state directory:\n%s\n---\n%s", before, after)
			}
		})
	}

	got, pr, err := Pull(ctx, PullOptions{State: b.state, Ref: ref, Verifiers: verifiersOf(t, a.vkey), QEMUVersion: testQEMU, Template: true})
	must(t, err)
	if pr.Kind != KindTemplate || pr.Present || got.Name != tpl.Name || got.Dir != filepath.Join(b.state.Templates(), tpl.Name) {
		t.Fatalf("pulled %+v into %s", pr, got.Dir)
	}
	if pr.Image != "busybox" || pr.ImageDigest != "sha256:tree" {
		t.Errorf("pull result names image %q %q", pr.Image, pr.ImageDigest)
	}
	must(t, (&snapshot.Store{Dir: b.state.Templates()}).Verify(got))
	qemuImg(t, "compare", "-q", tpl.DiskPath(), got.DiskPath())
	if got.ImageBase != filepath.Join(got.Dir, baseFile) || got.Origin == nil || got.Origin.Ref != ref || got.MemoryDigest != tpl.MemoryDigest {
		t.Errorf("pulled template %+v", got)
	}
	for _, f := range []string{tlsgw.KeyFile, sshgw.HostCAFile, tlsgw.CertFile} {
		if _, err := os.Stat(filepath.Join(got.Dir, f)); err == nil {
			t.Errorf("the pulled template has %s: its sandboxes would adopt a CA this host has no key for", f)
		}
	}
	// Again: already there, nothing fetched.
	_, pr2, err := Pull(ctx, PullOptions{State: b.state, Ref: ref, Verifiers: verifiersOf(t, a.vkey), QEMUVersion: testQEMU, Template: true})
	must(t, err)
	if !pr2.Present || pr2.Bytes != 0 {
		t.Errorf("second pull %+v; want present, nothing fetched", pr2)
	}
	if _, _, err := Pull(ctx, PullOptions{State: b.state, Ref: ref, Name: "mine", Verifiers: verifiersOf(t, a.vkey), QEMUVersion: testQEMU, Template: true}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("template pulled under another name: %v", err)
	}
}

// TestVerifiersTrustAKeyOnce: a key both in the trusted-log-keys file and
// named with --key (or an API call's keys) verifies a signature by it;
// note alone calls such a list ambiguous and refuses it.
func TestVerifiersTrustAKeyOnce(t *testing.T) {
	a := newHost(t, nil)
	sig, err := sign("sha256:abc", a.signer)
	must(t, err)
	v, n, err := Verifiers("host-a "+a.vkey+"\n", a.vkey)
	must(t, err)
	if n != 1 {
		t.Errorf("%d keys, want 1", n)
	}
	if d, _, err := openSignature(sig, v); err != nil || d != "sha256:abc" {
		t.Fatalf("a key trusted twice: %v", err)
	}
}
