package ocisnap

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Resolve returns the digest of the manifest ref names: its own digest
// for a reference by digest (no request), else the registry's answer to
// a HEAD of the tag. Pulling ref's repository at that digest then reads
// exactly the artifact resolved, even if the tag moves meanwhile.
func Resolve(ctx context.Context, ref string, opts ...remote.Option) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("ocisnap: %q is not an image reference (REGISTRY/REPO:TAG): %v: %w", ref, err, errdefs.ErrInvalid)
	}
	if d, ok := r.(name.Digest); ok {
		return d.DigestStr(), nil
	}
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	desc, err := remote.Head(r, opts...)
	if err != nil {
		return "", fmt.Errorf("ocisnap: resolve %s: %w", r, classify(err))
	}
	return desc.Digest.String(), nil
}
