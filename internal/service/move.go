package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/ocisnap"
)

// PushSnapshotRequest sends a snapshot to a registry.
type PushSnapshotRequest struct {
	Snapshot string `json:"snapshot"`
	Ref      string `json:"ref"`
	// SignKey is a file holding a note signer key to sign with instead of
	// this host's log key.
	SignKey  string `json:"sign_key,omitempty"`
	Compress string `json:"compress,omitempty"` // zstd (default) or none, for the memory layer
	// WithKernel sends the guest kernel along, for hosts that lack it.
	WithKernel bool                    `json:"with_kernel,omitempty"`
	Progress   func(sent, total int64) `json:"-"`
}

// PushSnapshot sends a snapshot to a registry as an artifact signed by
// this host's log key (or SignKey); blobs the registry holds are not sent.
func (s *Service) PushSnapshot(ctx context.Context, req PushSnapshotRequest) (*ocisnap.PushResult, error) {
	sn, err := s.snapshots().Get(req.Snapshot)
	if err != nil {
		return nil, err
	}
	signer, err := s.pushSigner(req.SignKey)
	if err != nil {
		return nil, err
	}
	return ocisnap.Push(ctx, ocisnap.PushOptions{State: s.state, Snapshot: sn, Ref: req.Ref, Signer: signer,
		Compress: req.Compress, WithKernel: req.WithKernel, Progress: req.Progress})
}

// pushSigner is the key a push signs with: the note signer key in file
// signKey, or this host's log key.
func (s *Service) pushSigner(signKey string) (note.Signer, error) {
	if signKey != "" {
		b, err := os.ReadFile(signKey)
		if err != nil {
			return nil, fmt.Errorf("--sign-key: %w", err)
		}
		signer, err := note.NewSigner(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("--sign-key %s is not a note signer key (PRIVATE+KEY+...): %v: %w", signKey, err, errdefs.ErrInvalid)
		}
		return signer, nil
	}
	k, err := audit.LoadOrCreatePinnedKey(s.state.Audit())
	if err != nil {
		return nil, err
	}
	return k.Signer(), nil
}

// PushTemplateRequest sends a boot template to a registry.
type PushTemplateRequest struct {
	Template   string                  `json:"template"`
	Ref        string                  `json:"ref"`
	SignKey    string                  `json:"sign_key,omitempty"`
	Compress   string                  `json:"compress,omitempty"`
	WithKernel bool                    `json:"with_kernel,omitempty"`
	Progress   func(sent, total int64) `json:"-"`
}

// PushTemplate sends a boot template to a registry as an artifact signed
// like a snapshot's: its memory state, its disk and the image's base,
// never the private keys of the gateway CAs its guest was made to trust
// (a host that pulls it gives its sandboxes CAs of their own).
func (s *Service) PushTemplate(ctx context.Context, req PushTemplateRequest) (*ocisnap.PushResult, error) {
	t, err := s.templates().Get(req.Template)
	if err != nil {
		return nil, err
	}
	signer, err := s.pushSigner(req.SignKey)
	if err != nil {
		return nil, err
	}
	return ocisnap.Push(ctx, ocisnap.PushOptions{State: s.state, Snapshot: t, Ref: req.Ref, Signer: signer, Template: true,
		Compress: req.Compress, WithKernel: req.WithKernel, Progress: req.Progress})
}

// PullTemplateRequest fetches a boot template from a registry.
type PullTemplateRequest struct {
	Ref string `json:"ref"`
	// Name, when set, must be the template's own: a template keeps its
	// name (the hash its first starts look it up by).
	Name string `json:"name,omitempty"`
	// KeyFiles hold verifier keys to trust besides the trusted-log-keys
	// file's; Keys are such keys themselves (the API's way).
	KeyFiles []string `json:"key_files,omitempty"`
	Keys     []string `json:"keys,omitempty"`
	// TrustOnly, as PullSnapshotRequest's: the only keys trusted.
	TrustOnly []string               `json:"-"`
	Progress  func(got, total int64) `json:"-"`
}

// PullTemplate fetches a boot template artifact into the template store,
// with the checks of PullSnapshot. It keeps its name, a hash of what its
// state depends on, so every first start on this host with those inputs
// (the image of ImageDigest, the machine's shape, this QEMU, kernel and
// smx-agent) restores it instead of booting. Pulling a template this host
// has is not an error (Present): a node makes sure of it that way.
func (s *Service) PullTemplate(ctx context.Context, req PullTemplateRequest) (*ocisnap.PullResult, error) {
	verifiers, err := s.pullVerifiers(req.Ref, req.KeyFiles, req.Keys, req.TrustOnly)
	if err != nil {
		return nil, err
	}
	_, res, err := ocisnap.Pull(ctx, ocisnap.PullOptions{State: s.state, Ref: req.Ref, Name: req.Name, Verifiers: verifiers, Progress: req.Progress, Template: true})
	if err != nil {
		return nil, err
	}
	if img, err := s.images().Get(res.Image); err == nil && img.Digest == res.ImageDigest {
		res.ImageOnHost = true
	}
	return res, nil
}

// PullSnapshotRequest fetches a snapshot from a registry.
type PullSnapshotRequest struct {
	Ref  string `json:"ref"`
	Name string `json:"name,omitempty"` // default: the pushed snapshot's name
	// KeyFiles hold verifier keys to trust besides the trusted-log-keys
	// file's (one per line).
	KeyFiles []string `json:"key_files,omitempty"`
	Keys     []string `json:"keys,omitempty"` // verifier keys themselves
	// TrustOnly, when set, holds the only verifier keys trusted (texts as
	// in trusted-log-keys); neither that file nor KeyFiles nor Keys are
	// read. The containerd shim passes the node's pod_restore_keys.
	TrustOnly []string               `json:"-"`
	Progress  func(got, total int64) `json:"-"`
}

// PullSnapshot fetches a snapshot artifact and stores it as a local
// snapshot, only if it is signed by a key this host trusts, every layer
// matches its signed digests and this host has the kernel and QEMU build
// its state needs. `smx agent restore` then starts it.
func (s *Service) PullSnapshot(ctx context.Context, req PullSnapshotRequest) (*ocisnap.PullResult, error) {
	verifiers, err := s.pullVerifiers(req.Ref, req.KeyFiles, req.Keys, req.TrustOnly)
	if err != nil {
		return nil, err
	}
	_, res, err := ocisnap.Pull(ctx, ocisnap.PullOptions{State: s.state, Ref: req.Ref, Name: req.Name, Verifiers: verifiers, Progress: req.Progress})
	return res, err
}

// pullVerifiers are the keys a pulled artifact may be signed by: the
// trusted-log-keys file's, those in keyFiles and keys, or trustOnly
// alone when it is set; none is a refusal.
func (s *Service) pullVerifiers(ref string, keyFiles, keys, trustOnly []string) (note.Verifiers, error) {
	texts := trustOnly
	if trustOnly != nil {
		keyFiles, keys = nil, nil
	}
	if file, err := audit.TrustedKeysFile(); err == nil && trustOnly == nil {
		b, err := os.ReadFile(file)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("trusted keys: %w", err)
		}
		texts = append(texts, string(b))
	}
	for _, f := range keyFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--key: %w", err)
		}
		texts = append(texts, string(b))
	}
	texts = append(texts, keys...)
	verifiers, n, err := ocisnap.Verifiers(texts...)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("pull %s refused: this host trusts no signing key: pass the sending host's public key with --key FILE (`smx logs export-key` there prints it): %w", ref, errdefs.ErrDenied)
	}
	return verifiers, nil
}

// ExportLog writes sandbox name's log, its checkpoints and this host's
// log public key as a bundle (a tar stream) for an auditor elsewhere.
func (s *Service) ExportLog(ctx context.Context, name string, w io.Writer) error {
	s.awaitDiscard(ctx, name)
	dir, err := s.logDir(name)
	if err != nil {
		return err
	}
	k, err := audit.LoadOrCreatePinnedKey(s.state.Audit())
	if err != nil {
		return err
	}
	return audit.ExportBundle(w, dir, k.PublicKey())
}

// VerifyLogBundles verifies exported log bundles against the keys this
// host trusts (the trusted-log-keys file, this host's own key, keyFiles)
// and proves the links between them: a log that continues another after
// a move names the old log's record by hash.
func (s *Service) VerifyLogBundles(ctx context.Context, files, keyFiles []string) ([]audit.BundleReport, error) {
	var trusted []string
	if file, err := audit.TrustedKeysFile(); err == nil {
		b, _ := os.ReadFile(file)
		trusted = append(trusted, keyLines(string(b))...)
	}
	if k, err := audit.LoadOrCreatePinnedKey(s.state.Audit()); err == nil {
		trusted = append(trusted, k.PublicKey())
	}
	for _, f := range keyFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--key: %w", err)
		}
		trusted = append(trusted, keyLines(string(b))...)
	}
	return audit.VerifyBundles(files, trusted)
}

// keyLines are the verifier keys of a trusted-log-keys style text: the
// last word of each line that is not blank or a comment.
func keyLines(text string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		out = append(out, f[len(f)-1])
	}
	return out
}
