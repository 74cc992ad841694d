package service

import (
	"context"
	"fmt"
	"path"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/supproto"
)

// MountRequest adds a mount to a running sandbox (Mount, in -v notation
// HOST:GUEST[:ro,uid=N,gid=N,protect=off]) or removes one (Guest, the
// mount's guest path).
type MountRequest struct {
	Name  string `json:"name"`
	Mount string `json:"mount,omitempty"`
	Guest string `json:"guest,omitempty"`
}

// MountList is a running sandbox's mounts in -v notation: its -v mounts
// and its profile's files.mounts.
type MountList struct {
	Name   string   `json:"name"`
	Mounts []string `json:"mounts"`
}

// AddMount mounts a host folder in a running sandbox, over its virtio-fs
// device (QEMU 8.2 or newer, and a sandbox that started with a mount):
// the supervisor checks it as a -v mount at create is checked, refuses a
// mount point the profile denies (a file.refused record), opens a file
// gateway for it, has the guest bind it in place, keeps it in the spec so
// later starts mount it too, and records mount.add.
func (s *Service) AddMount(ctx context.Context, req MountRequest) (*MountList, error) {
	m, err := sandbox.ParseMount(req.Mount)
	if err != nil {
		return nil, err
	}
	return s.changeMount(ctx, req.Name, supproto.OpMountAdd, m.String(), "")
}

// RemoveMount unmounts the mount at guest path req.Guest of a running
// sandbox (lazily in the guest: a busy mount leaves the guest's tree at
// once) and drops it on the host: files the guest still holds open there
// fail from their next operation. Recorded as mount.remove. A mount the
// profile's files.mounts makes is not removed (ErrInvalid); nothing
// mounted there is ErrNotFound.
func (s *Service) RemoveMount(ctx context.Context, req MountRequest) (*MountList, error) {
	if !path.IsAbs(req.Guest) || path.Clean(req.Guest) != req.Guest || req.Guest == "/" {
		return nil, fmt.Errorf("mount rm %s: name the mount by its guest path, absolute and clean (e.g. /work): %w", req.Guest, errdefs.ErrInvalid)
	}
	return s.changeMount(ctx, req.Name, supproto.OpMountRemove, "", req.Guest)
}

func (s *Service) changeMount(ctx context.Context, name, op, volume, guest string) (*MountList, error) {
	if _, t, err := s.check(name, sandbox.OpExec); err != nil {
		return nil, err
	} else if !t.Supervisor {
		return nil, fmt.Errorf("sandbox %s is not running: mounts change only on a running sandbox; give -v at create otherwise: %w", name, errdefs.ErrFailed)
	}
	l, err := s.client(name).Mount(ctx, op, volume, guest)
	if err != nil {
		return nil, err
	}
	if l == nil {
		l = []string{}
	}
	return &MountList{Name: name, Mounts: l}, nil
}
