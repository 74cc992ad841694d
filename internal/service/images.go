package service

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/image"
	"github.com/smx-dev/smx/internal/snapshot"
)

// ImageBuildRequest builds an image from a base.
type ImageBuildRequest struct {
	Name string `json:"name"`
	// From is busybox (seconds) or debian (bookworm; minutes, needs root).
	From     string   `json:"from"`
	Packages []string `json:"packages,omitempty"` // extra Debian packages
	// Progress receives the build's human-readable progress lines.
	Progress io.Writer `json:"-"`
}

// BuildImage builds an image. The image appears whole or not at all:
// cancelling ctx removes the half-written build (the error then says so).
func (s *Service) BuildImage(ctx context.Context, req ImageBuildRequest) (*image.Image, error) {
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	var pk []string
	for _, p := range req.Packages {
		if p = strings.TrimSpace(p); p != "" {
			pk = append(pk, p)
		}
	}
	progress := req.Progress
	if progress == nil {
		progress = io.Discard
	}
	var img *image.Image
	var err error
	switch req.From {
	case "busybox":
		if len(pk) > 0 {
			return nil, fmt.Errorf("--packages applies to --from debian only: %w", errdefs.ErrInvalid)
		}
		img, err = s.images().BuildBusybox(ctx, req.Name, progress)
	case "debian":
		img, err = s.images().BuildDebian(ctx, req.Name, pk, progress)
	default:
		return nil, fmt.Errorf("--from %q: use busybox or debian (or `smx image import` for OCI images): %w", req.From, errdefs.ErrInvalid)
	}
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("image build interrupted; nothing was kept: %w", ctx.Err())
	}
	return img, err
}

// ImageImportRequest imports an OCI image.
type ImageImportRequest struct {
	Name string `json:"name"`
	// Ref is docker-archive:FILE or oci-layout:DIR, on this host.
	Ref      string    `json:"ref"`
	Progress io.Writer `json:"-"`
}

// ImportImage imports an OCI image, flattened with whiteouts applied.
// Like BuildImage, it leaves nothing behind when cancelled or failed.
func (s *Service) ImportImage(ctx context.Context, req ImageImportRequest) (*image.Image, error) {
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	progress := req.Progress
	if progress == nil {
		progress = io.Discard
	}
	img, err := s.images().Import(ctx, req.Name, req.Ref, progress)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("image import interrupted; nothing was kept: %w", ctx.Err())
	}
	return img, err
}

// ImagePullRequest pulls an OCI image from a registry.
type ImagePullRequest struct {
	Name string `json:"name"`
	// Ref is NAME[:TAG] or NAME@sha256:... in its registry (linux/amd64).
	Ref      string    `json:"ref"`
	Progress io.Writer `json:"-"`
}

// PullImage pulls and flattens an OCI image; a digest in Ref is verified.
// Like BuildImage, it leaves nothing behind when cancelled or failed.
func (s *Service) PullImage(ctx context.Context, req ImagePullRequest) (*image.PullResult, error) {
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	progress := req.Progress
	if progress == nil {
		progress = io.Discard
	}
	return s.images().Pull(ctx, req.Name, req.Ref, progress)
}

// ListImages returns every image, sorted by name.
func (s *Service) ListImages(ctx context.Context) ([]image.Image, error) {
	list, err := s.images().List()
	if list == nil {
		list = []image.Image{}
	}
	return list, err
}

// InspectImage returns one image.
func (s *Service) InspectImage(ctx context.Context, name string) (*image.Image, error) {
	return s.images().Get(name)
}

// RemoveImage removes an image and its boot templates; refused
// (errdefs.ErrInUse) while a sandbox or a snapshot is based on it.
func (s *Service) RemoveImage(ctx context.Context, name string) error {
	s.awaitDiscards(ctx)
	err := s.images().Remove(name, func(name string) (bool, error) {
		used, err := s.manager().ImagesInUse()
		if err != nil || used[name] {
			return used[name], err
		}
		// A snapshot's disk layer is backed by the image's base.
		snaps, err := s.snapshots().List()
		for _, sn := range snaps {
			if sn.Image == name {
				return true, err
			}
		}
		return false, err
	})
	if err != nil {
		return err
	}
	// Its boot templates go with it (nothing uses them: every sandbox or
	// snapshot backed by one also uses the image).
	_, err = s.RemoveTemplates(ctx, func(t *snapshot.Snapshot) bool { return t.Image == name })
	return err
}

// ListTemplates returns the boot templates.
func (s *Service) ListTemplates(ctx context.Context) ([]snapshot.Snapshot, error) {
	list, err := s.templates().List()
	if list == nil {
		list = []snapshot.Snapshot{}
	}
	return list, err
}

// TemplateUsers says which sandboxes and snapshots have a disk backed by
// template name.
func (s *Service) TemplateUsers(name string) ([]string, error) {
	var users []string
	list, err := s.manager().List()
	if err != nil {
		return nil, err
	}
	for _, in := range list {
		if in.Spec.Template == name {
			users = append(users, "sandbox "+in.Spec.Name)
		}
	}
	snaps, err := s.snapshots().List()
	if err != nil {
		return nil, err
	}
	for _, sn := range snaps {
		if sn.Template == name {
			users = append(users, "snapshot "+sn.Name)
		}
	}
	return users, nil
}

// RemoveTemplate removes one boot template; refused (errdefs.ErrInUse)
// while a sandbox or snapshot is backed by it.
func (s *Service) RemoveTemplate(ctx context.Context, name string) error {
	s.awaitDiscards(ctx)
	return s.templates().Remove(name, s.TemplateUsers)
}

// RemoveTemplates removes every template match selects and returns their
// names (a nil match selects all); one still in use stops it with an
// error.
func (s *Service) RemoveTemplates(ctx context.Context, match func(*snapshot.Snapshot) bool) ([]string, error) {
	if match == nil {
		match = func(*snapshot.Snapshot) bool { return true }
	}
	list, err := s.templates().List()
	if err != nil {
		return nil, err
	}
	var done []string
	for i := range list {
		if match(&list[i]) {
			if err := s.templates().Remove(list[i].Name, s.TemplateUsers); err != nil {
				return done, err
			}
			done = append(done, list[i].Name)
		}
	}
	return done, nil
}
