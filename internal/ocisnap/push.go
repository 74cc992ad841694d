package ocisnap

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/hosttool"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/tarfs"
)

// Compression of the memory layer.
const (
	CompressZstd = "zstd"
	CompressNone = "none"
)

// PushOptions says what to push where.
type PushOptions struct {
	State    statedir.Dir
	Snapshot *snapshot.Snapshot
	Ref      string
	Signer   note.Signer
	// Compress is CompressZstd (the default) or CompressNone for the
	// memory layer; disk layers are sent as they are (qcow2 is already
	// allocation-compact, and sending the file's own bytes keeps a base's
	// blob digest that of the file, so every push of it dedups).
	Compress string
	// WithKernel adds the guest kernel (its cache directory) as a layer,
	// for hosts that lack it; it is sent once per registry.
	WithKernel bool
	// Progress, when set, is called as bytes go out: sent so far, and
	// the most that may be sent (blobs the registry has are skipped).
	Progress func(sent, total int64)
	// Remote are extra options for the registry client (tests pass a
	// transport); logins come from Docker's config by default.
	Remote []remote.Option
	// Template says Snapshot is a boot template (from the template
	// store). Its layers are its memory state, its disk and the image
	// base: never the gateway CAs' private keys kept beside them, nor its
	// shared-RAM form (the receiving host makes its own).
	Template bool
}

// PushResult is what a push did.
type PushResult struct {
	Kind     string `json:"kind"`     // snapshot or template
	Snapshot string `json:"snapshot"` // the snapshot's or template's name
	Ref      string `json:"ref"`
	Digest   string `json:"digest"` // the manifest's
	Signer   string `json:"signer"`
	Layers   []struct {
		Layer
		Sent bool `json:"sent"` // false when the registry already had it
	} `json:"layers"`
	BytesTotal int64 `json:"bytes_total"` // every blob's size
	BytesSent  int64 `json:"bytes_sent"`  // what went over the wire
	// MemoryBytes is the memory state's size, MemoryStored what its layer
	// takes (compressed), CompressMS how long compressing it took.
	MemoryBytes  int64 `json:"memory_bytes"`
	MemoryStored int64 `json:"memory_stored"`
	CompressMS   int64 `json:"compress_ms"`
	DurationMS   int64 `json:"duration_ms"`
}

// Push sends a snapshot to a registry as a signed artifact.
func Push(ctx context.Context, o PushOptions) (*PushResult, error) {
	start := time.Now()
	sn := o.Snapshot
	if len(sn.Mounts) > 0 {
		return nil, fmt.Errorf("ocisnap: snapshot %s mounts host folders (%s), which are not part of it and would name folders of whichever host restores it: only snapshots without mounts move between hosts: %w",
			sn.Name, strings.Join(sn.Mounts, ", "), errdefs.ErrFailed)
	}
	ref, err := name.ParseReference(o.Ref)
	if err != nil {
		return nil, fmt.Errorf("ocisnap: %q is not an image reference (REGISTRY/REPO:TAG): %v: %w", o.Ref, err, errdefs.ErrInvalid)
	}
	if o.Compress == "" {
		o.Compress = CompressZstd
	}
	if o.Compress != CompressZstd && o.Compress != CompressNone {
		return nil, fmt.Errorf("ocisnap: --compress %q: use zstd or none: %w", o.Compress, errdefs.ErrInvalid)
	}
	chain, err := backingChain(ctx, sn.DiskPath())
	if err != nil {
		return nil, err
	}
	if ab, _ := filepath.Abs(sn.ImageBase); chain[len(chain)-1] != ab {
		return nil, fmt.Errorf("ocisnap: the snapshot's disk chain ends at %q, not its image's base %q: %w", chain[len(chain)-1], sn.ImageBase, errdefs.ErrFailed)
	}
	k, err := kernel.Load(o.State.Kernels(), sn.Kernel)
	if err != nil {
		return nil, fmt.Errorf("ocisnap: snapshot %s: kernel %s: %w", sn.Name, sn.Kernel, err)
	}
	kd, _, err := snapshot.FileDigest(k.Vmlinuz)
	if err != nil {
		return nil, fmt.Errorf("ocisnap: kernel: %w", err)
	}

	tmp, err := os.MkdirTemp(o.State.Root, ".push-")
	if err != nil {
		return nil, fmt.Errorf("ocisnap: %w", err)
	}
	defer os.RemoveAll(tmp)

	res := &PushResult{Kind: KindSnapshot, Snapshot: sn.Name, Ref: ref.String(), MemoryBytes: sn.MemoryStateBytes}
	meta := Meta{Version: 1, Snapshot: *sn, KernelDigest: kd}
	artifactType := ArtifactType
	if o.Template {
		// A template is no sandbox's history: no log head, no profile.
		meta.Kind, res.Kind, artifactType = KindTemplate, KindTemplate, TemplateArtifactType
	} else {
		meta.LogHead = FindLogHead(o.State.Logs(), sn)
	}
	meta.Snapshot.Origin, meta.Snapshot.SharedRAMBytes = nil, 0
	files := map[string]string{}

	// Each file is read once to digest it and once to send it (the memory
	// state once to compress and digest both forms): the digests recorded
	// at snapshot time are checked against these, not by a pass of their own.
	type part struct {
		role, mt, path string
		l              Layer // digests when already known
	}
	mem := part{role: RoleMemory, mt: MemoryType, path: sn.MemoryPath()}
	if o.Compress == CompressZstd {
		t := time.Now()
		mem.mt, mem.path = MemoryZstdType, filepath.Join(tmp, "memory.zst")
		if mem.l, err = compressFile(mem.path, sn.MemoryPath()); err != nil {
			return nil, err
		}
		res.CompressMS = time.Since(t).Milliseconds()
	}
	parts := []part{mem, {role: RoleDisk, mt: DiskType, path: sn.DiskPath()}}
	// The layers between the snapshot's disk and the image base: a parent
	// snapshot's disk, a boot template's. A template's is the same for
	// every sandbox started from it, so it is sent once per registry.
	for _, p := range chain[1 : len(chain)-1] {
		parts = append(parts, part{role: RoleBacking, mt: BackingType, path: p})
	}
	parts = append(parts, part{role: RoleBase, mt: BaseType, path: chain[len(chain)-1]})
	if !o.Template {
		parts = append(parts, part{role: RoleProfile, mt: ProfileType, path: sn.ProfilePath()})
	}
	if o.WithKernel {
		kp := part{role: RoleKernel, mt: KernelType, path: filepath.Join(tmp, "kernel.tar.zst")}
		if kp.l, err = packKernel(kp.path, k); err != nil {
			return nil, err
		}
		parts = append(parts, kp)
	}
	for _, p := range parts {
		l := p.l
		l.Role, l.MediaType = p.role, p.mt
		if l.Digest == "" {
			if l.Digest, l.Size, err = snapshot.FileDigest(p.path); err != nil {
				return nil, fmt.Errorf("ocisnap: %s layer: %w", p.role, err)
			}
		}
		if l.DiffID == "" {
			l.DiffID, l.DiffSize = l.Digest, l.Size
		}
		switch {
		case p.role == RoleMemory && l.DiffID != sn.MemoryDigest, p.role == RoleDisk && l.DiffID != sn.DiskDigest:
			return nil, fmt.Errorf("ocisnap: snapshot %s: its %s layer does not match its digest: the snapshot is corrupt (`smx snapshot inspect %s --verify`): %w", sn.Name, p.role, sn.Name, errdefs.ErrFailed)
		case p.role == RoleMemory:
			res.MemoryStored = l.Size
		}
		meta.Layers = append(meta.Layers, l)
		files[l.Digest] = p.path
	}
	mb, _ := json.MarshalIndent(meta, "", "  ")
	metaPath := filepath.Join(tmp, "meta.json")
	if err := os.WriteFile(metaPath, mb, 0o600); err != nil {
		return nil, fmt.Errorf("ocisnap: %w", err)
	}
	ml := Layer{Role: "meta", MediaType: MetaType}
	ml.Digest, ml.Size, _ = snapshot.FileDigest(metaPath)
	ml.DiffID, ml.DiffSize = ml.Digest, ml.Size
	files[ml.Digest] = metaPath
	sig, err := sign(ml.Digest, o.Signer)
	if err != nil {
		return nil, err
	}
	res.Signer = fmt.Sprintf("%s+%08x", o.Signer.Name(), o.Signer.KeyHash())

	var sent atomic.Int64
	var total int64
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.MediaType(artifactType))
	var adds []mutate.Addendum
	layers := append([]Layer{ml}, meta.Layers...)
	var fls []*fileLayer
	for _, l := range layers {
		total += l.Size
		fl := &fileLayer{l: l, path: files[l.Digest], sent: &sent, progress: func(n int64) {
			if o.Progress != nil {
				o.Progress(n, total)
			}
		}}
		fls = append(fls, fl)
		adds = append(adds, mutate.Addendum{MediaType: types.MediaType(l.MediaType), Layer: fl})
	}
	if img, err = mutate.Append(img, adds...); err != nil {
		return nil, fmt.Errorf("ocisnap: %w", err)
	}
	img = mutate.Annotations(img, map[string]string{SignatureAnnot: sig}).(v1.Image)
	opts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, o.Remote...)
	if err := remote.Write(ref, img, opts...); err != nil {
		return nil, fmt.Errorf("ocisnap: push %s: %w", ref, classify(err))
	}
	d, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("ocisnap: %w", err)
	}
	res.Digest = d.String()
	res.BytesTotal, res.BytesSent = total, sent.Load()
	for _, fl := range fls {
		res.Layers = append(res.Layers, struct {
			Layer
			Sent bool `json:"sent"`
		}{fl.l, fl.opened.Load()})
	}
	res.DurationMS = time.Since(start).Milliseconds()
	return res, nil
}

// classify turns a registry's refusal into an error class.
func classify(err error) error {
	s := err.Error()
	switch {
	case strings.Contains(s, "UNAUTHORIZED") || strings.Contains(s, "DENIED"):
		return fmt.Errorf("%v: log in with `docker login` (smx reads Docker's config): %w", err, errdefs.ErrDenied)
	case strings.Contains(s, "MANIFEST_UNKNOWN") || strings.Contains(s, "NAME_UNKNOWN") || strings.Contains(s, "404"):
		return fmt.Errorf("%v: %w", err, errdefs.ErrNotFound)
	}
	return fmt.Errorf("%v: %w", err, errdefs.ErrUnavailable)
}

// maxChain bounds a disk's backing chain.
const maxChain = 16

// backingChain lists disk and the files it is backed by, down to the one
// backed by nothing, as absolute paths.
func backingChain(ctx context.Context, disk string) ([]string, error) {
	qemuImg, err := hosttool.Look("qemu-img")
	if err != nil {
		return nil, fmt.Errorf("ocisnap: qemu-img not found: install qemu-utils (run `smx setup`): %w", errdefs.ErrUnavailable)
	}
	out, err := exec.CommandContext(ctx, qemuImg, "info", "-U", "--backing-chain", "--output=json", disk).Output()
	if err != nil {
		return nil, fmt.Errorf("ocisnap: qemu-img info %s: %v", disk, err)
	}
	var infos []struct {
		Filename string `json:"filename"`
		Format   string `json:"format"`
	}
	if err := json.Unmarshal(out, &infos); err != nil {
		return nil, fmt.Errorf("ocisnap: qemu-img info %s: %v", disk, err)
	}
	if len(infos) < 2 || len(infos) > maxChain {
		return nil, fmt.Errorf("ocisnap: %s has a backing chain of %d files; want 2 to %d: %w", disk, len(infos), maxChain, errdefs.ErrFailed)
	}
	var chain []string
	for _, in := range infos {
		if in.Format != "qcow2" {
			return nil, fmt.Errorf("ocisnap: %s is %s, not qcow2: %w", in.Filename, in.Format, errdefs.ErrFailed)
		}
		p, _ := filepath.Abs(in.Filename)
		chain = append(chain, p)
	}
	return chain, nil
}

// compressFile writes src to dst compressed with zstd at its fastest
// level, and returns both forms' digests and sizes (Digest, Size of dst;
// DiffID, DiffSize of src), from the one pass. The memory state is mostly
// zero pages and code, where the fastest level already gets most of the
// gain (about 4.5x on a busybox guest's 46 MB state).
func compressFile(dst, src string) (Layer, error) {
	var l Layer
	in, err := os.Open(src)
	if err != nil {
		return l, fmt.Errorf("ocisnap: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return l, fmt.Errorf("ocisnap: %w", err)
	}
	defer out.Close()
	blob := sha256.New()
	bw := &countWriter{w: io.MultiWriter(out, blob)}
	enc, err := zstd.NewWriter(bw, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return l, fmt.Errorf("ocisnap: zstd: %w", err)
	}
	diff := sha256.New()
	n, err := io.Copy(io.MultiWriter(enc, diff), in)
	if err != nil {
		enc.Close()
		return l, fmt.Errorf("ocisnap: compress: %w", err)
	}
	if err := enc.Close(); err != nil {
		return l, fmt.Errorf("ocisnap: compress: %w", err)
	}
	l.Digest, l.Size = "sha256:"+hex.EncodeToString(blob.Sum(nil)), bw.n
	l.DiffID, l.DiffSize = "sha256:"+hex.EncodeToString(diff.Sum(nil)), n
	return l, out.Close()
}

// packKernel writes k's cache directory to dst as a zstd-compressed tar
// and returns the tar's digest and size. Compression runs on one thread so
// the same kernel makes the same blob, which a registry then holds once.
func packKernel(dst string, k *kernel.Kernel) (Layer, error) {
	var l Layer
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return l, fmt.Errorf("ocisnap: %w", err)
	}
	defer out.Close()
	blob := sha256.New()
	bw := &countWriter{w: io.MultiWriter(out, blob)}
	enc, err := zstd.NewWriter(bw, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return l, fmt.Errorf("ocisnap: zstd: %w", err)
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(enc, h)}
	if err := tarfs.Pack(cw, k.Dir, k.Version); err != nil {
		enc.Close()
		return l, fmt.Errorf("ocisnap: kernel %s: %w", k.Version, err)
	}
	if err := enc.Close(); err != nil {
		return l, fmt.Errorf("ocisnap: kernel: %w", err)
	}
	l.Digest, l.Size = "sha256:"+hex.EncodeToString(blob.Sum(nil)), bw.n
	l.DiffID, l.DiffSize = "sha256:"+hex.EncodeToString(h.Sum(nil)), cw.n
	return l, out.Close()
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// FindLogHead finds the record of the source sandbox's log that recorded
// sn being taken (kind snapshot.create with its name and memory digest),
// or nil when the log is gone.
func FindLogHead(logs string, sn *snapshot.Snapshot) *snapshot.LogHead {
	var head *snapshot.LogHead
	var logID string
	err := audit.Scan(audit.Dir(logs, sn.Source), audit.Filter{}, func(r audit.Record) error {
		if r.Kind == audit.KindLogCreate {
			logID, _ = r.Fields["log_id"].(string)
		}
		if r.Kind == audit.KindSnapshotCreate && r.Fields["snapshot"] == sn.Name && r.Fields["memory_digest"] == sn.MemoryDigest {
			b, _ := json.Marshal(r)
			var h struct {
				Hash string `json:"hash"`
			}
			json.Unmarshal(b, &h)
			head = &snapshot.LogHead{Sandbox: sn.Source, LogID: logID, Seq: r.Seq, Hash: h.Hash}
		}
		return nil
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return head
}
