// Package ocisnap moves snapshots between hosts as signed OCI artifacts in
// any registry.
//
// An artifact is an OCI image manifest whose layers are the snapshot's
// parts, each stored as its own blob so a registry that already holds one
// (the image's base disk, above all) is not sent it again:
//
//	meta     application/vnd.smx.snapshot.meta.v1+json   Meta: the snapshot's metadata, the
//	                                                     kernel's digest, the log head, every
//	                                                     other layer's digests
//	memory   application/vnd.smx.snapshot.memory.v1[+zstd] QEMU's migration stream
//	disk     application/vnd.smx.snapshot.disk.v1         the sandbox's qcow2 overlay
//	backing  application/vnd.smx.snapshot.backing.v1      each layer between it and the base
//	                                                     (a boot template's disk, parent snapshots')
//	base     application/vnd.smx.snapshot.base.v1         the image's qcow2 base it is backed by
//	profile  application/vnd.smx.snapshot.profile.v1+yaml the frozen security profile
//	kernel   application/vnd.smx.kernel.v1.tar+zstd       optional (push --with-kernel): the guest
//	                                                     kernel's cache directory, installed by a
//	                                                     pull on a host that lacks that kernel
//
// A boot template travels the same way (Meta.Kind "template", artifact
// type application/vnd.smx.template.v1): its memory state, its disk and
// the image base, no profile and no log head. The private keys of the
// gateway CAs its guest was made to trust stay on the host that saved it:
// a host that pulls it has no key for them, so its sandboxes started from
// the template make CAs of their own and their guests are made to trust
// those instead as they come up (the trust store's smx block is replaced,
// as for a fork). A pulled template keeps its name, the hash of what its
// state depends on, by which first starts on the receiving host find it.
//
// Every state records the machine type and virtual CPU it ran on
// (snapshot.Host): a pull refuses, naming what is missing, a state saved
// under KVM on a host without KVM or without every CPU flag the guest
// saw, or one saved under TCG with another CPU model; a restore checks
// the same again.
//
// The manifest carries, as an annotation, a note (golang.org/x/mod/sumdb/note)
// signed by the sending host's log key over the meta layer's digest. A pull
// verifies the note against the keys the receiving host trusts before it
// reads anything else, fetches every layer by the digest Meta names,
// checks each against its digests as it is written, checks that this host
// has the kernel (by digest) and QEMU build the state needs, and publishes
// the snapshot only when all of it is in place (snapshot.Store's staging):
// a refused pull leaves nothing behind.
package ocisnap

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/snapshot"
)

// Media types of the artifact.
const (
	ArtifactType         = "application/vnd.smx.snapshot.v1"
	TemplateArtifactType = "application/vnd.smx.template.v1"
	MetaType             = "application/vnd.smx.snapshot.meta.v1+json"
	MemoryType           = "application/vnd.smx.snapshot.memory.v1"
	MemoryZstdType       = "application/vnd.smx.snapshot.memory.v1+zstd"
	DiskType             = "application/vnd.smx.snapshot.disk.v1"
	BackingType          = "application/vnd.smx.snapshot.backing.v1"
	BaseType             = "application/vnd.smx.snapshot.base.v1"
	ProfileType          = "application/vnd.smx.snapshot.profile.v1+yaml"
	KernelType           = "application/vnd.smx.kernel.v1.tar+zstd"
	SignatureAnnot       = "dev.smx.snapshot.signature"
	signaturePrefix      = "smx-snapshot/v1\n"
)

// Layer roles, in the order they are sent.
const (
	RoleMemory  = "memory"
	RoleDisk    = "disk"
	RoleBacking = "backing" // zero or more, in chain order
	RoleBase    = "base"
	RoleProfile = "profile"
	RoleKernel  = "kernel" // optional, last: the kernel cache directory as a tar
)

// Layer describes one blob of the artifact.
type Layer struct {
	Role      string `json:"role"`
	MediaType string `json:"media_type"`
	Digest    string `json:"digest"` // of the blob as stored (compressed, if it is)
	Size      int64  `json:"size"`
	// DiffID and DiffSize are the file's own digest and size, once
	// decompressed: what the pulling host checks what it wrote against.
	DiffID   string `json:"diff_id"`
	DiffSize int64  `json:"diff_size"`
}

// Kinds of artifact: a snapshot of a sandbox, or a boot template.
const (
	KindSnapshot = "snapshot"
	KindTemplate = "template"
)

// Meta is the artifact's signed description of itself.
type Meta struct {
	Version int `json:"version"`
	// Kind is KindSnapshot (also when empty) or KindTemplate: signed, so
	// one cannot be pulled as the other.
	Kind     string            `json:"kind,omitempty"`
	Snapshot snapshot.Snapshot `json:"snapshot"`
	// KernelDigest is the sha256 of the guest kernel's bzImage the state
	// was running: the receiving host must have that kernel (by this
	// digest, not only by version).
	KernelDigest string            `json:"kernel_digest"`
	LogHead      *snapshot.LogHead `json:"log_head,omitempty"`
	Layers       []Layer           `json:"layers"`
}

func (m *Meta) kind() string {
	if m.Kind == "" {
		return KindSnapshot
	}
	return m.Kind
}

func (m *Meta) layer(role string) (Layer, bool) {
	for _, l := range m.Layers {
		if l.Role == role {
			return l, true
		}
	}
	return Layer{}, false
}

// signatureText is the note body a signature covers: the meta blob's
// digest, which in turn names every other blob's.
func signatureText(metaDigest string) string { return signaturePrefix + metaDigest + "\n" }

// sign returns the signed note over metaDigest.
func sign(metaDigest string, signer note.Signer) (string, error) {
	b, err := note.Sign(&note.Note{Text: signatureText(metaDigest)}, signer)
	if err != nil {
		return "", fmt.Errorf("ocisnap: sign: %w", err)
	}
	return string(b), nil
}

// openSignature checks a signature against verifiers and returns the meta
// digest it vouches for and the key that signed it.
func openSignature(sig string, verifiers note.Verifiers) (digest, signer string, err error) {
	if sig == "" {
		return "", "", fmt.Errorf("the artifact carries no signature (%s): push it with `smx snapshot push`: %w", SignatureAnnot, errdefs.ErrDenied)
	}
	n, err := note.Open([]byte(sig), verifiers)
	if err != nil {
		var unk *note.UnverifiedNoteError
		if errors.As(err, &unk) {
			var names []string
			for _, s := range unk.Note.UnverifiedSigs {
				names = append(names, fmt.Sprintf("%s+%08x", s.Name, s.Hash))
			}
			return "", "", fmt.Errorf("the artifact is signed by %s, which this host does not trust: add the sending host's public key (`smx logs export-key` there) to ~/.config/smx/trusted-log-keys or pass --key: %w",
				strings.Join(names, ", "), errdefs.ErrDenied)
		}
		return "", "", fmt.Errorf("the artifact's signature does not verify (%v): %w", err, errdefs.ErrDenied)
	}
	if !strings.HasPrefix(n.Text, signaturePrefix) {
		return "", "", fmt.Errorf("the artifact's signature is not over an smx snapshot: %w", errdefs.ErrDenied)
	}
	digest = strings.TrimSuffix(strings.TrimPrefix(n.Text, signaturePrefix), "\n")
	if len(n.Sigs) > 0 {
		signer = fmt.Sprintf("%s+%08x", n.Sigs[0].Name, n.Sigs[0].Hash)
	}
	return digest, signer, nil
}

// Verifiers parses verifier keys, one per line; a line may name what the
// key is for before it ("LABEL KEY", the trusted-log-keys format), and
// blank lines and lines starting with # are skipped.
func Verifiers(texts ...string) (note.Verifiers, int, error) {
	var list []note.Verifier
	// A key trusted twice (in the trusted-log-keys file and named again
	// with --key) is one key: note refuses a list with it twice as
	// ambiguous.
	seen := map[string]bool{}
	for _, text := range texts {
		for _, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if i := strings.LastIndexByte(line, ' '); i >= 0 {
				line = line[i+1:]
			}
			if seen[line] {
				continue
			}
			seen[line] = true
			v, err := note.NewVerifier(line)
			if err != nil {
				return nil, 0, fmt.Errorf("ocisnap: trusted key %q: %v: %w", line, err, errdefs.ErrInvalid)
			}
			list = append(list, v)
		}
	}
	return note.VerifierList(list...), len(list), nil
}
