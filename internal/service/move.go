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
	var signer note.Signer
	if req.SignKey != "" {
		b, err := os.ReadFile(req.SignKey)
		if err != nil {
			return nil, fmt.Errorf("--sign-key: %w", err)
		}
		if signer, err = note.NewSigner(strings.TrimSpace(string(b))); err != nil {
			return nil, fmt.Errorf("--sign-key %s is not a note signer key (PRIVATE+KEY+...): %v: %w", req.SignKey, err, errdefs.ErrInvalid)
		}
	} else {
		k, err := audit.LoadOrCreatePinnedKey(s.state.Audit())
		if err != nil {
			return nil, err
		}
		signer = k.Signer()
	}
	return ocisnap.Push(ctx, ocisnap.PushOptions{State: s.state, Snapshot: sn, Ref: req.Ref, Signer: signer,
		Compress: req.Compress, WithKernel: req.WithKernel, Progress: req.Progress})
}

// PullSnapshotRequest fetches a snapshot from a registry.
type PullSnapshotRequest struct {
	Ref  string `json:"ref"`
	Name string `json:"name,omitempty"` // default: the pushed snapshot's name
	// KeyFiles hold verifier keys to trust besides the trusted-log-keys
	// file's (one per line).
	KeyFiles []string `json:"key_files,omitempty"`
	// TrustOnly, when set, holds the only verifier keys trusted (texts as
	// in trusted-log-keys); neither that file nor KeyFiles are read. The
	// containerd shim passes the node's pod_restore_keys.
	TrustOnly []string               `json:"-"`
	Progress  func(got, total int64) `json:"-"`
}

// PullSnapshot fetches a snapshot artifact and stores it as a local
// snapshot, only if it is signed by a key this host trusts, every layer
// matches its signed digests and this host has the kernel and QEMU build
// its state needs. `smx agent restore` then starts it.
func (s *Service) PullSnapshot(ctx context.Context, req PullSnapshotRequest) (*ocisnap.PullResult, error) {
	texts, keyFiles := req.TrustOnly, req.KeyFiles
	if req.TrustOnly != nil {
		keyFiles = nil
	}
	if file, err := audit.TrustedKeysFile(); err == nil && req.TrustOnly == nil {
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
	verifiers, n, err := ocisnap.Verifiers(texts...)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, fmt.Errorf("pull %s refused: this host trusts no signing key: pass the sending host's public key with --key FILE (`smx logs export-key` there prints it): %w", req.Ref, errdefs.ErrDenied)
	}
	_, res, err := ocisnap.Pull(ctx, ocisnap.PullOptions{State: s.state, Ref: req.Ref, Name: req.Name, Verifiers: verifiers, Progress: req.Progress})
	return res, err
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
