package shim

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/log"
	"github.com/google/go-containerregistry/pkg/name"
	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/ocisnap"
	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/statedir"
)

// Pods restored from a registry: a pod annotated with FromSnapshotAnnotation
// does not boot its root file system; its VM is restored from a snapshot
// artifact (internal/ocisnap) that another host pushed, so a pod on any
// node starts from the same warm state, its processes running. What the
// annotation may name is the node's decision, like the profile
// (Config.restoreRef): the registry and repository must be under one of
// pod_restore_from's prefixes and the artifact signed by one of
// pod_restore_keys. Everything is checked before anything starts.
//
// The restored VM's root disk is the snapshot's: the pod's sandbox
// (pause) container runs no process in it (hold), and app containers run
// in the restored guest's own root, not in their images' (no device can
// be added to a restored microVM, so there is no pod share to put their
// roots in; see docs/kubernetes.md).

// FromSnapshotAnnotation names the snapshot artifact (REGISTRY/REPO:TAG or
// REGISTRY/REPO@sha256:...) a pod's VM, or a stand-alone task's, is
// restored from instead of booted.
const FromSnapshotAnnotation = "io.smx.from-snapshot"

// FromTemplateAnnotation names a boot template artifact (`smx template
// push` on the host that built it) a pod's VM starts from: the shim
// pulls it into the node's template store, then boots the pod the normal
// way, its image root, pod share and volumes its own, and the first
// start, whose inputs hash to the template's name, restores the template
// instead of booting. A fleet of pods starts warm from one template
// pushed once. The node admits it as FromSnapshotAnnotation.
const FromTemplateAnnotation = "io.smx.from-template"

// sourceKind is what kind of artifact a VM starts from.
type sourceKind int

const (
	fromSnapshot sourceKind = iota
	fromTemplate
)

func (k sourceKind) String() string { return [...]string{"snapshot", "template"}[k] }

// cacheName is the local name an artifact is kept under on this node: a
// function of its manifest digest alone, so that a second pod of the
// same artifact, by whatever reference, restores the copy already here.
func cacheName(kind sourceKind, digest string) string {
	hex := strings.TrimPrefix(digest, "sha256:")
	if len(hex) > 48 {
		hex = hex[:48]
	}
	if kind == fromTemplate {
		return "template-" + hex
	}
	return "pulled-" + hex
}

// pullTemplate makes the template artifact ref present in this node's
// template store, where it keeps its own name (the hash first starts
// look it up by), and says what it is. Every pod's pull checks the
// artifact's signature against the node's keys as they are now (a
// present template costs the manifest and the signed meta, nothing
// more: PullTemplate's Present); concurrent pulls of one artifact on a
// node wait for each other.
func (s *Shim) pullTemplate(ctx context.Context, cfg *Config, ref name.Reference) (*ocisnap.PullResult, error) {
	keys, err := cfg.restoreKeys()
	if err != nil {
		return nil, err
	}
	if _, n, err := ocisnap.Verifiers(keys...); err != nil {
		return nil, fmt.Errorf("smx shim: pod_restore_keys in %s: %w", cfg.source, err)
	} else if n == 0 {
		return nil, fmt.Errorf("smx shim: %s: this node trusts no signing key for pods: add the sending host's key to pod_restore_keys in %s: %w", ref, cfg.source, errdefs.ErrDenied)
	}
	digest, err := ocisnap.Resolve(ctx, ref.String())
	if err != nil {
		return nil, fmt.Errorf("smx shim: template %s: %w", ref, err)
	}
	lockDir := s.svc.State().Templates()
	if err := os.MkdirAll(lockDir, 0o700); err != nil {
		return nil, fmt.Errorf("smx shim: %w", err)
	}
	lock, err := statedir.LockFile(filepath.Join(lockDir, "."+cacheName(fromTemplate, digest)+".pull.lock"))
	if err != nil {
		return nil, err
	}
	defer lock.Unlock()
	pinned := ref.Context().Digest(digest).String()
	res, err := s.svc.PullTemplate(ctx, service.PullTemplateRequest{Ref: pinned, TrustOnly: keys})
	if errors.Is(err, errdefs.ErrDenied) {
		return nil, fmt.Errorf("smx shim: template %s (pods on this node trust only the keys of pod_restore_keys in %s): %w", ref, cfg.source, err)
	}
	if err != nil {
		return nil, fmt.Errorf("smx shim: template %s: %w", ref, err)
	}
	res.Ref = ref.String() // as the pod names it, in what the shim says
	if res.Present {
		log.G(ctx).Infof("smx shim: template %s (%s, signed by %s) is on this node as %s", ref, digest, res.Signer, res.Snapshot)
	} else {
		log.G(ctx).Infof("smx shim: pulled template %s (%s, signed by %s) as %s: %d bytes in %d ms", ref, digest, res.Signer, res.Snapshot, res.Bytes, res.DurationMS)
	}
	return res, nil
}

// pull makes the artifact ref, of kind, present on this node and returns
// its local name. The reference is resolved to its manifest's digest
// first; an artifact this node already pulled at that digest is used as
// it is (after checking that its signer is still one the node trusts),
// any other is pulled by that digest, verified against the node's keys
// (and only those) before any of it is stored. Concurrent pulls of one
// artifact on a node wait for each other.
func (s *Shim) pull(ctx context.Context, cfg *Config, kind sourceKind, ref name.Reference) (string, error) {
	keys, err := cfg.restoreKeys()
	if err != nil {
		return "", err
	}
	verifiers, n, err := ocisnap.Verifiers(keys...)
	if err != nil {
		return "", fmt.Errorf("smx shim: pod_restore_keys in %s: %w", cfg.source, err)
	}
	if n == 0 {
		return "", fmt.Errorf("smx shim: %s: this node trusts no signing key for pods: add the sending host's key to pod_restore_keys in %s: %w", ref, cfg.source, errdefs.ErrDenied)
	}
	digest, err := ocisnap.Resolve(ctx, ref.String())
	if err != nil {
		return "", fmt.Errorf("smx shim: %s %s: %w", kind, ref, err)
	}
	local := cacheName(kind, digest)
	lockDir := s.svc.State().Snapshots()
	if err := os.MkdirAll(lockDir, 0o700); err != nil {
		return "", fmt.Errorf("smx shim: %w", err)
	}
	lock, err := statedir.LockFile(filepath.Join(lockDir, "."+local+".pull.lock"))
	if err != nil {
		return "", err
	}
	defer lock.Unlock()
	sn, err := s.svc.InspectSnapshot(ctx, local, false)
	switch {
	case err == nil:
		o := sn.Origin
		if o == nil || o.Manifest != digest {
			return "", fmt.Errorf("smx shim: %s %s: this node's snapshot %s is not that artifact (%s): remove it (`smx snapshot rm %s`): %w", kind, ref, local, digest, local, errdefs.ErrExists)
		}
		// Pulled under keys the node may have withdrawn since.
		if !signerTrusted(verifiers, o.Signer) {
			return "", fmt.Errorf("smx shim: %s %s: this node's copy is signed by %s, which pod_restore_keys in %s no longer lists: %w", kind, ref, o.Signer, cfg.source, errdefs.ErrDenied)
		}
		return local, nil
	case !errors.Is(err, errdefs.ErrNotFound):
		return "", err
	}
	pinned := ref.Context().Digest(digest).String()
	res, err := s.svc.PullSnapshot(ctx, service.PullSnapshotRequest{Ref: pinned, Name: local, TrustOnly: keys})
	if errors.Is(err, errdefs.ErrDenied) {
		// The pull's advice is a person's (trusted-log-keys, --key):
		// pods trust the node's list alone.
		return "", fmt.Errorf("smx shim: %s %s (pods on this node trust only the keys of pod_restore_keys in %s): %w", kind, ref, cfg.source, err)
	}
	if err != nil {
		return "", fmt.Errorf("smx shim: %s %s: %w", kind, ref, err)
	}
	log.G(ctx).Infof("smx shim: pulled %s %s (%s, signed by %s): %d bytes in %d ms", kind, ref, digest, res.Signer, res.Bytes, res.DurationMS)
	return local, nil
}

// signerTrusted reports whether a signer as ocisnap names it (NAME+HASH)
// is one of verifiers'.
func signerTrusted(verifiers note.Verifiers, signer string) bool {
	i := strings.LastIndexByte(signer, '+')
	if i < 0 {
		return false
	}
	h, err := strconv.ParseUint(signer[i+1:], 16, 32)
	if err != nil {
		return false
	}
	_, err = verifiers.Verifier(signer[:i], uint32(h))
	return err == nil
}

// restore starts the task's VM from the artifact ref of kind, with the
// profile the node admitted: pulled (or found in the node's cache),
// then restored as the sandbox vm.name, which belongs to this shim (it
// goes when the shim does).
func (s *Shim) restore(ctx context.Context, cfg *Config, vm *podVM, profile string, kind sourceKind, ref name.Reference) error {
	local, err := s.pull(ctx, cfg, kind, ref)
	if err != nil {
		return err
	}
	owner, ownerW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer owner.Close() // the supervisor has its own copy
	var once sync.Once
	var rerr error
	// release stops and removes the restored sandbox; it must not be
	// called for a sandbox this shim did not create.
	release := func() error {
		once.Do(func() {
			// The sandbox goes before the pipe's write end, so that its
			// supervisor does not remove it under this removal.
			err := s.svc.Remove(context.WithoutCancel(ctx), service.RemoveRequest{Name: vm.name, Force: true})
			if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				rerr = fmt.Errorf("removing sandbox %s: %w", vm.name, err)
			}
			ownerW.Close()
		})
		return rerr
	}
	// A pod's lifetime is the kubelet's: no limit inherited from the
	// snapshot's source stops it.
	_, err = s.svc.Restore(ctx, service.RestoreRequest{
		Snapshot: local, Name: vm.name, Profile: profile, Timeout: "0", IdleStop: "0", Owner: owner,
	})
	if errors.Is(err, errdefs.ErrExists) {
		// Not ours: a sandbox of that name was there before (a dead
		// shim's, which containerd's delete action removes).
		ownerW.Close()
		return fmt.Errorf("smx shim: sandbox %s: restore %s %s: %w", vm.name, kind, ref, err)
	}
	if err != nil {
		release()
		return fmt.Errorf("smx shim: sandbox %s: restore %s %s: %w", vm.name, kind, ref, err)
	}
	vm.restored = true
	vm.release = release
	return nil
}
