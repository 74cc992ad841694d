package ocisnap

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/hosttool"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/tarfs"
	"github.com/smx-dev/smx/internal/vm"
)

// maxMeta bounds the meta blob: it is read into memory before anything
// vouches for its size.
const maxMeta = 1 << 20

const baseFile = "base.qcow2"

// fileNames are the files of a snapshot directory the layers become, in
// the order of layers; backing layers are backing-N.qcow2.
func fileNames(layers []Layer) ([]string, error) {
	var names []string
	nb := 0
	for _, l := range layers {
		switch l.Role {
		case RoleMemory:
			names = append(names, "memory.state")
		case RoleDisk:
			names = append(names, "disk.qcow2")
		case RoleBacking:
			nb++
			names = append(names, fmt.Sprintf("backing-%d.qcow2", nb))
		case RoleBase:
			names = append(names, baseFile)
		case RoleProfile:
			names = append(names, "profile.yaml")
		case RoleKernel:
			names = append(names, "kernel.tar")
		default:
			return nil, fmt.Errorf("unknown layer role %q: %w", l.Role, errdefs.ErrInvalid)
		}
	}
	return names, nil
}

// PullOptions says what to pull and whom to trust.
type PullOptions struct {
	State statedir.Dir
	Ref   string
	Name  string // the local snapshot's name; default the pushed one's
	// Verifiers are the keys a signature may be by.
	Verifiers note.Verifiers
	// QEMUVersion is this host's (vm.QEMUVersion when empty).
	QEMUVersion string
	// HostCPU is this host's machine and CPU as a restore would run it:
	// Accel the accelerator, CPU the model, CPUFlags the host's flags
	// under KVM (vm.DetectAccel and vm.CPUOf when nil).
	HostCPU  *snapshot.Host
	Progress func(got, total int64)
	Remote   []remote.Option
	// Template pulls a boot template into the template store instead of
	// a snapshot into the snapshot store. A template keeps its name (a
	// hash of what its state depends on, which is how a first start on
	// this host finds it), so Name must be empty or that name.
	Template bool
}

// PullResult is what a pull did.
type PullResult struct {
	Kind       string `json:"kind"`     // snapshot or template
	Snapshot   string `json:"snapshot"` // the local snapshot's or template's name
	Ref        string `json:"ref"`
	Digest     string `json:"digest"`
	Signer     string `json:"signer"`
	Bytes      int64  `json:"bytes"` // blob bytes received
	DurationMS int64  `json:"duration_ms"`
	// Present: this host already had the template, with the same state;
	// nothing was fetched.
	Present bool `json:"present,omitempty"`
	// Image and ImageDigest name the image a template serves: a first
	// start on this host restores it only for an image of that digest.
	Image       string `json:"image,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	// ImageOnHost: this host has that image (filled in by the caller,
	// which keeps the image store).
	ImageOnHost bool `json:"image_on_host,omitempty"`
}

// Pull fetches a snapshot artifact, verifies it and stores it as a local
// snapshot. Nothing is stored unless every check passes.
func Pull(ctx context.Context, o PullOptions) (*snapshot.Snapshot, *PullResult, error) {
	start := time.Now()
	ref, err := name.ParseReference(o.Ref)
	if err != nil {
		return nil, nil, fmt.Errorf("ocisnap: %q is not an image reference (REGISTRY/REPO:TAG): %v: %w", o.Ref, err, errdefs.ErrInvalid)
	}
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("pull %s refused: "+format, append([]any{o.Ref}, args...)...)
	}
	opts := append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, o.Remote...)
	// One puller for every request of the pull: the registry's ping and
	// token exchange happen once, not once per blob.
	puller, err := remote.NewPuller(opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("ocisnap: pull %s: %w", ref, classify(err))
	}
	opts = append(opts, remote.Reuse(puller))
	img, err := remote.Image(ref, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("ocisnap: pull %s: %w", ref, classify(err))
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, nil, fmt.Errorf("ocisnap: pull %s: %w", ref, classify(err))
	}
	d, _ := img.Digest()
	res := &PullResult{Ref: ref.String(), Digest: d.String()}

	// The signature first: nothing else is read before the artifact is
	// known to come from a trusted host.
	metaDigest, signer, err := openSignature(m.Annotations[SignatureAnnot], o.Verifiers)
	if err != nil {
		return nil, nil, refuse("%w", err)
	}
	res.Signer = signer
	// The manifest must list exactly the signed meta and the layers it
	// names: an artifact that says one thing and signs another is refused
	// rather than quietly read by the signed digests.
	var listed []string
	for _, l := range m.Layers {
		listed = append(listed, l.Digest.String())
	}
	if len(listed) == 0 || listed[0] != metaDigest {
		return nil, nil, refuse("the manifest's meta layer is not the one signed (%s): %w", short(metaDigest), errdefs.ErrDenied)
	}
	metaBlob, err := fetch(ref, metaDigest, maxMeta, opts)
	if err != nil {
		return nil, nil, refuse("meta layer: %w", err)
	}
	var meta Meta
	if err := json.Unmarshal(metaBlob, &meta); err != nil || meta.Version != 1 {
		return nil, nil, refuse("the meta layer is not an smx snapshot (version %d, %v): %w", meta.Version, err, errdefs.ErrInvalid)
	}
	if want := kindOf(o.Template); meta.kind() != want {
		return nil, nil, refuse("it is a %s, not a %s: use `smx %s pull`: %w", meta.kind(), want, meta.kind(), errdefs.ErrInvalid)
	}
	res.Kind = meta.kind()
	if len(listed) != len(meta.Layers)+1 {
		return nil, nil, refuse("the manifest lists %d layers, the signed meta %d: %w", len(listed)-1, len(meta.Layers), errdefs.ErrDenied)
	}
	for i, l := range meta.Layers {
		if listed[i+1] != l.Digest {
			return nil, nil, refuse("the manifest's %s layer is not the one signed: %w", l.Role, errdefs.ErrDenied)
		}
	}
	// The layers in the order push writes them: memory, disk, backing...,
	// base, profile (a snapshot's only), kernel (optional).
	withKernel := len(meta.Layers) > 0 && meta.Layers[len(meta.Layers)-1].Role == RoleKernel
	nk := 0
	if withKernel {
		nk = 1
	}
	fixed := 4 // memory, disk, base, profile
	if o.Template {
		fixed = 3
	}
	if len(meta.Layers)-nk < fixed || len(meta.Layers)-nk > maxChain+fixed-1 {
		return nil, nil, refuse("the artifact has %d layers: %w", len(meta.Layers), errdefs.ErrInvalid)
	}
	want := []string{RoleMemory, RoleDisk}
	for range len(meta.Layers) - nk - fixed {
		want = append(want, RoleBacking)
	}
	want = append(want, RoleBase)
	if !o.Template {
		want = append(want, RoleProfile)
	}
	if withKernel {
		want = append(want, RoleKernel)
	}
	types := map[string][]string{RoleMemory: {MemoryType, MemoryZstdType}, RoleDisk: {DiskType}, RoleBacking: {BackingType}, RoleBase: {BaseType}, RoleProfile: {ProfileType}, RoleKernel: {KernelType}}
	for i, l := range meta.Layers {
		if l.Role != want[i] || !slices.Contains(types[l.Role], l.MediaType) {
			return nil, nil, refuse("layer %d is a %q of type %q, want a %q: %w", i, l.Role, l.MediaType, want[i], errdefs.ErrInvalid)
		}
	}
	files, err := fileNames(meta.Layers)
	if err != nil {
		return nil, nil, refuse("%w", err)
	}

	// What this host needs to load the state.
	sn := meta.Snapshot
	installKernel, err := checkHost(ctx, o, &meta, withKernel)
	if err != nil {
		return nil, nil, refuse("%w", err)
	}
	store := &snapshot.Store{Dir: o.State.Snapshots()}
	if o.Template {
		store.Dir = o.State.Templates()
		res.Image, res.ImageDigest = sn.Image, sn.ImageDigest
		if o.Name != "" && o.Name != sn.Name {
			return nil, nil, fmt.Errorf("template %s keeps its name (a hash of what its state depends on, by which a first start finds it): drop --name: %w", sn.Name, errdefs.ErrInvalid)
		}
	}
	if o.Name == "" {
		o.Name = sn.Name
	}
	if err := snapshot.ValidName(o.Name); err != nil {
		return nil, nil, err
	}
	if have, err := store.Get(o.Name); err == nil {
		if o.Template && have.MemoryDigest == sn.MemoryDigest {
			// Pulling a template every node already has is how a
			// fleet makes sure of it: not an error, and nothing fetched.
			res.Snapshot, res.Present = have.Name, true
			res.DurationMS = time.Since(start).Milliseconds()
			return have, res, nil
		}
		what, rm := "snapshot", "pick another --name or `smx snapshot rm "+o.Name+"`"
		if o.Template {
			what, rm = "template", "this host has another template of that name: `smx template rm "+o.Name+"` first"
		}
		return nil, nil, fmt.Errorf("%s %s: %w: %s", what, o.Name, errdefs.ErrExists, rm)
	}
	// Layers land in a directory of their own beside the store, and move
	// into a store build only once all of them are checked: a refused
	// pull leaves nothing, not even an empty store.
	stage, err := os.MkdirTemp(o.State.Root, ".pull-")
	if err != nil {
		return nil, nil, fmt.Errorf("ocisnap: %w", err)
	}
	defer os.RemoveAll(stage)

	// The layers come at once, each checked as it is written: the memory
	// state's decompression and hashing overlap the disks' transfer.
	var total int64
	for _, l := range meta.Layers {
		total += l.Size
	}
	var got atomic.Int64
	errs := make([]error, len(meta.Layers))
	var wg sync.WaitGroup
	for i, l := range meta.Layers {
		if l.Role == RoleKernel && !installKernel {
			continue
		}
		wg.Go(func() {
			var last int64
			_, errs[i] = fetchFile(ref, l, filepath.Join(stage, files[i]), opts, func(n int64) {
				sum := got.Add(n - last)
				last = n
				if o.Progress != nil {
					o.Progress(sum, total)
				}
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, nil, refuse("%s layer: %w", meta.Layers[i].Role, err)
		}
	}
	res.Bytes = got.Load()

	if installKernel {
		if err := installKernelTar(filepath.Join(stage, "kernel.tar"), o.State.Kernels(), sn.Kernel, meta.KernelDigest); err != nil {
			return nil, nil, refuse("kernel layer: %w", err)
		}
	}
	b, err := store.Begin(o.Name)
	if err != nil {
		return nil, nil, err
	}
	defer b.Abort()
	for _, file := range files {
		if file == "kernel.tar" {
			continue
		}
		if err := os.Rename(filepath.Join(stage, file), filepath.Join(b.Dir, file)); err != nil {
			return nil, nil, fmt.Errorf("ocisnap: %w", err)
		}
	}
	// Each disk layer was backed by a path on the sending host: point it
	// at the copy of the next beside it (relative, so the rename into
	// place keeps it valid). Lower layers are read-only like the base;
	// Commit makes the top one read-only too.
	base := slices.Index(files, baseFile)
	for i := 1; i < base; i++ {
		if err := rebase(ctx, filepath.Join(b.Dir, files[i]), files[i+1]); err != nil {
			return nil, nil, err
		}
		if i > 1 {
			if err := os.Chmod(filepath.Join(b.Dir, files[i]), 0o444); err != nil {
				return nil, nil, fmt.Errorf("ocisnap: %w", err)
			}
		}
	}
	if err := os.Chmod(filepath.Join(b.Dir, baseFile), 0o444); err != nil {
		return nil, nil, fmt.Errorf("ocisnap: %w", err)
	}
	disk, _ := meta.layer(RoleDisk)
	sn.Dir = ""
	// The chain came whole: this snapshot depends on no parent or
	// template of this host.
	sn.Parent, sn.Template = "", ""
	sn.ImageBase = filepath.Join(store.Dir, o.Name, baseFile)
	sn.Origin = &snapshot.Origin{Ref: ref.String(), Manifest: res.Digest, Signer: signer, DiskDigest: disk.DiffID, LogHead: meta.LogHead}
	// The memory state is the one the signed meta names: its digest was
	// checked as it was written.
	mem, _ := meta.layer(RoleMemory)
	sn.MemoryDigest, sn.MemoryStateBytes = mem.DiffID, mem.DiffSize
	out, err := b.CommitVerified(sn)
	if err != nil {
		return nil, nil, err
	}
	res.Snapshot = out.Name
	res.DurationMS = time.Since(start).Milliseconds()
	return out, res, nil
}

// checkHost says exactly what this host lacks to restore the state.
func checkHost(ctx context.Context, o PullOptions, meta *Meta, withKernel bool) (installKernel bool, err error) {
	sn := meta.Snapshot
	// A restore mounts the snapshot's host folders again: paths chosen on
	// another host must not pick folders of this one.
	if len(sn.Mounts) > 0 {
		return false, fmt.Errorf("the snapshot mounts host folders (%s) of the host that took it: a pulled snapshot may not name this host's folders: %w", strings.Join(sn.Mounts, ", "), errdefs.ErrDenied)
	}
	v := o.QEMUVersion
	if v == "" {
		// From the cache the supervisor keeps (keyed by the binary), when
		// there is one: a pull that is refused writes nothing, not even
		// the cache.
		cache := filepath.Join(o.State.Root, "cache", "qemu-version")
		if _, serr := os.Stat(cache); serr == nil {
			v, err = vm.QEMUVersionCached(ctx, "", cache)
		} else {
			v, err = vm.QEMUVersion(ctx, "")
		}
		if err != nil {
			return false, err
		}
	}
	var missing []string
	if v != sn.QEMUVersion {
		missing = append(missing, fmt.Sprintf("QEMU %q (this host runs %q; a saved state only loads on the same QEMU build)", sn.QEMUVersion, v))
	}
	k, err := kernel.Load(o.State.Kernels(), sn.Kernel)
	if err != nil && withKernel {
		// The artifact carries it: the pull installs it.
		installKernel = true
	} else if err != nil {
		missing = append(missing, fmt.Sprintf("guest kernel %s (%s; `smx kernel ls` lists this host's; push with --with-kernel to send it along)", sn.Kernel, short(meta.KernelDigest)))
	} else if kd, _, err := snapshot.FileDigest(k.Vmlinuz); err != nil || kd != meta.KernelDigest {
		missing = append(missing, fmt.Sprintf("guest kernel %s with digest %s (this host's %s is %s)", sn.Kernel, short(meta.KernelDigest), sn.Kernel, short(kd)))
	}
	missing = append(missing, missingCPU(o, sn.Host)...)
	if len(missing) > 0 {
		return false, fmt.Errorf("this host lacks %s: %w", strings.Join(missing, " and "), errdefs.ErrFailed)
	}
	return installKernel, nil
}

// missingCPU says what of the machine and virtual CPU a state saved on
// saved needs this host lacks: a state saved under KVM needs KVM here and
// every CPU flag its guest saw; one saved under TCG the same emulated
// model (and QEMU build, checked apart).
func missingCPU(o PullOptions, saved snapshot.Host) []string {
	cur := o.HostCPU
	if cur == nil {
		accel, why := vm.DetectAccel()
		if saved.Accel == string(vm.AccelTCG) {
			// A state loads under its own accelerator: a KVM host
			// restores a TCG state under TCG.
			accel = vm.AccelTCG
		}
		model, flags := vm.CPUOf(accel)
		cur = &snapshot.Host{Accel: string(accel), Machine: vm.MachineType, CPU: model, CPUFlags: flags}
		if accel != vm.AccelKVM {
			why = ": " + why
		} else {
			why = ""
		}
		if saved.Accel == string(vm.AccelKVM) && accel != vm.AccelKVM {
			return []string{"KVM (the state was saved under KVM" + why + ")"}
		}
	}
	if saved.Accel != "" && cur.Accel != saved.Accel {
		return []string{fmt.Sprintf("the accelerator %s (this host runs %s)", saved.Accel, cur.Accel)}
	}
	return saved.MissingCPU(*cur)
}

func kindOf(template bool) string {
	if template {
		return KindTemplate
	}
	return KindSnapshot
}

// installKernelTar unpacks a kernel layer into the kernel cache as
// version, only if its bzImage has the signed digest. It is unpacked
// beside the cache's entries (a name kernel listings skip) and renamed
// into place whole.
func installKernelTar(tarPath, cache, version, digest string) error {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	stage, err := os.MkdirTemp(cache, ".tmp-pull-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := tarfs.Extract(f, stage, tarfs.Options{From: version, Name: "k"}); err != nil {
		return err
	}
	k := filepath.Join(stage, "k")
	if got, _, err := snapshot.FileDigest(filepath.Join(k, "vmlinuz")); err != nil || got != digest {
		return fmt.Errorf("its bzImage is %s, not the signed %s: %w", short(got), short(digest), errdefs.ErrDenied)
	}
	if _, err := os.Stat(filepath.Join(k, "lib", "modules", version, "modules.dep")); err != nil {
		return fmt.Errorf("it has no modules.dep: %w", errdefs.ErrInvalid)
	}
	if err := os.Rename(k, filepath.Join(cache, version)); err != nil {
		return fmt.Errorf("install kernel %s: %w", version, err)
	}
	return nil
}

func short(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

// fetch reads a small blob by digest, checked.
func fetch(ref name.Reference, digest string, max int64, opts []remote.Option) ([]byte, error) {
	l, err := remote.Layer(ref.Context().Digest(digest), opts...)
	if err != nil {
		return nil, classify(err)
	}
	rc, err := l.Compressed()
	if err != nil {
		return nil, classify(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, max+1))
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrFailed)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("larger than %d bytes: %w", max, errdefs.ErrInvalid)
	}
	if got := digestOf(b); got != digest {
		return nil, fmt.Errorf("content has digest %s, not the signed %s: %w", short(got), short(digest), errdefs.ErrDenied)
	}
	return b, nil
}

func digestOf(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}

// fetchFile writes one layer to dst (decompressed), checking the blob
// against Digest and Size and the file against DiffID and DiffSize.
func fetchFile(ref name.Reference, l Layer, dst string, opts []remote.Option, progress func(int64)) (int64, error) {
	rl, err := remote.Layer(ref.Context().Digest(l.Digest), opts...)
	if err != nil {
		return 0, classify(err)
	}
	rc, err := rl.Compressed()
	if err != nil {
		return 0, classify(err)
	}
	defer rc.Close()
	blobHash := sha256.New()
	counted := &progressReader{r: io.TeeReader(io.LimitReader(rc, l.Size+1), blobHash), fn: progress}
	var src io.Reader = counted
	switch l.MediaType {
	case MemoryZstdType, KernelType:
		dec, err := zstd.NewReader(counted, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return 0, err
		}
		defer dec.Close()
		src = dec
	case MemoryType, DiskType, BackingType, BaseType, ProfileType:
	default:
		return 0, fmt.Errorf("unknown media type %q: %w", l.MediaType, errdefs.ErrInvalid)
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	fileHash := sha256.New()
	n, err := io.Copy(f, io.TeeReader(io.LimitReader(src, l.DiffSize+1), fileHash))
	if err == nil {
		// Drain what the decompressor did not need, so the blob's digest
		// covers all of it.
		_, err = io.Copy(io.Discard, counted)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// A damaged blob usually fails decompression first: read the rest
		// so the error names what is wrong, the blob, when it is.
		io.Copy(io.Discard, counted)
		if counted.n > l.Size || sum(blobHash) != l.Digest {
			return counted.n, fmt.Errorf("the blob does not match its signed digest %s (%v): %w", short(l.Digest), err, errdefs.ErrDenied)
		}
		return counted.n, fmt.Errorf("%v: %w", err, errdefs.ErrFailed)
	}
	if counted.n != l.Size || sum(blobHash) != l.Digest {
		return counted.n, fmt.Errorf("the blob does not match its signed digest %s: %w", short(l.Digest), errdefs.ErrDenied)
	}
	if n != l.DiffSize || sum(fileHash) != l.DiffID {
		return counted.n, fmt.Errorf("the content does not match its signed digest %s: %w", short(l.DiffID), errdefs.ErrDenied)
	}
	return counted.n, nil
}

func sum(h hash.Hash) string { return "sha256:" + hex.EncodeToString(h.Sum(nil)) }

type progressReader struct {
	r  io.Reader
	n  int64
	fn func(int64)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.n += int64(n)
	if n > 0 && p.fn != nil {
		p.fn(p.n)
	}
	return n, err
}

// rebase points a qcow2 overlay at another backing file without touching
// its data.
func rebase(ctx context.Context, disk, backing string) error {
	qemuImg, err := hosttool.Look("qemu-img")
	if err != nil {
		return fmt.Errorf("ocisnap: qemu-img not found: install qemu-utils (run `smx setup`): %w", errdefs.ErrUnavailable)
	}
	cmd := exec.CommandContext(ctx, qemuImg, "rebase", "-u", "-f", "qcow2", "-F", "qcow2", "-b", backing, filepath.Base(disk))
	cmd.Dir = filepath.Dir(disk)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ocisnap: qemu-img rebase: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
