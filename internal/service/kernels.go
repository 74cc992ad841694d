package service

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/snapshot"
)

// KernelInfo is one cached guest kernel and who is pinned to it.
type KernelInfo struct {
	Version   string   `json:"version"`
	Default   bool     `json:"default"` // what new sandboxes get
	Own       bool     `json:"own"`     // smx's own kernel (smx kernel build)
	Sandboxes []string `json:"sandboxes"`
	Snapshots []string `json:"snapshots"`
}

// kernelUsers maps each kernel version to the sandboxes and snapshots pinned
// to it. A sandbox made before pinning counts for the kernel it last booted.
func (s *Service) kernelUsers() (sandboxes, snapshots map[string][]string, err error) {
	sandboxes, snapshots = map[string][]string{}, map[string][]string{}
	list, err := s.manager().List()
	if err != nil {
		return nil, nil, err
	}
	for _, in := range list {
		v := in.Spec.Kernel
		if v == "" {
			v = in.State.Kernel
		}
		if v != "" {
			sandboxes[v] = append(sandboxes[v], in.Spec.Name)
		}
	}
	snaps, err := s.snapshots().List()
	if err != nil {
		return nil, nil, err
	}
	for _, sn := range snaps {
		snapshots[sn.Kernel] = append(snapshots[sn.Kernel], sn.Name)
	}
	return sandboxes, snapshots, nil
}

// ListKernels returns the cached guest kernels, newest (the default for
// new sandboxes) first, with the sandboxes and snapshots pinned to each;
// with all it also lists versions that are pinned but no longer cached.
func (s *Service) ListKernels(ctx context.Context) ([]KernelInfo, error) {
	ks, err := kernel.List(s.state.Kernels())
	if err != nil {
		return nil, err
	}
	sbs, sns, err := s.kernelUsers()
	if err != nil {
		return nil, err
	}
	rows := []KernelInfo{}
	for i, k := range ks {
		rows = append(rows, KernelInfo{Version: k.Version, Default: i == 0, Own: k.Own,
			Sandboxes: nonNil(sbs[k.Version]), Snapshots: nonNil(sns[k.Version])})
	}
	return rows, nil
}

// PinnedElsewhere returns, for every kernel version other than current,
// the sandboxes and snapshots pinned to it (a new kernel never switches
// them).
func (s *Service) PinnedElsewhere(ctx context.Context, current string) (sandboxes, snapshots map[string][]string, err error) {
	sbs, sns, err := s.kernelUsers()
	if err != nil {
		return nil, nil, err
	}
	delete(sbs, current)
	delete(sns, current)
	return sbs, sns, nil
}

// RemoveKernel removes a cached guest kernel and its boot templates;
// refused (errdefs.ErrInUse) while a sandbox or snapshot is pinned to it.
// It holds the sandboxes lock, under which creates pin the newest kernel,
// so none can pin the one being removed.
func (s *Service) RemoveKernel(ctx context.Context, version string) error {
	s.awaitDiscards(ctx)
	lock, err := s.manager().LockAll()
	if err != nil {
		return err
	}
	defer lock.Unlock()
	if _, err := kernel.Load(s.state.Kernels(), version); err != nil {
		return err
	}
	sbs, sns, err := s.kernelUsers()
	if err != nil {
		return err
	}
	if len(sbs[version]) > 0 || len(sns[version]) > 0 {
		var users []string
		for _, n := range sbs[version] {
			users = append(users, "sandbox "+n)
		}
		for _, n := range sns[version] {
			users = append(users, "snapshot "+n)
		}
		return fmt.Errorf("kernel: remove %s: still used by %s: remove them first: %w", version, strings.Join(users, ", "), errdefs.ErrInUse)
	}
	if _, err := s.RemoveTemplates(ctx, func(t *snapshot.Snapshot) bool { return t.Kernel == version }); err != nil {
		return err
	}
	return kernel.Remove(s.state.Kernels(), version)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// KernelBuildRequest builds smx's own guest kernel from Debian's kernel
// source (minutes; cached by source version and config).
type KernelBuildRequest struct {
	Jobs    int    `json:"jobs,omitempty"` // make -j; 0: one per CPU
	Nice    bool   `json:"nice,omitempty"` // compile at low priority
	WorkDir string `json:"work_dir,omitempty"`
	// Progress gets a line when each phase starts and every 30 s.
	Progress io.Writer `json:"-"`
}

// BuildKernel builds (or finds cached) smx's own guest kernel; new
// sandboxes then get it, existing ones stay pinned to theirs.
func (s *Service) BuildKernel(ctx context.Context, req KernelBuildRequest) (*KernelInfo, error) {
	if req.Jobs < 0 {
		return nil, fmt.Errorf("kernel build: jobs %d: want 0 (one per CPU) or more: %w", req.Jobs, errdefs.ErrInvalid)
	}
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	k, err := kernel.Build(ctx, s.state.Kernels(), kernel.BuildOptions{Jobs: req.Jobs, Nice: req.Nice, WorkDir: req.WorkDir, Progress: req.Progress})
	if err != nil {
		return nil, err
	}
	return s.kernelInfo(ctx, k.Version)
}

// SetupKernel readies the guest kernel new sandboxes get: Debian's
// kernel package is always fetched (what new sandboxes get until smx's
// own is built); with own, smx's own is built too. It returns the kernel
// new sandboxes now get (smx's own whenever one is cached).
func (s *Service) SetupKernel(ctx context.Context, own bool, progress io.Writer) (*KernelInfo, error) {
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	k, err := kernel.Ensure(ctx, s.state.Kernels(), progress)
	if err != nil {
		return nil, err
	}
	if own {
		if k, err = kernel.Build(ctx, s.state.Kernels(), kernel.BuildOptions{Progress: progress}); err != nil {
			return nil, err
		}
	} else if o, err := kernel.Find(s.state.Kernels()); err == nil && o.Own {
		k = o
	}
	return s.kernelInfo(ctx, k.Version)
}

// KernelBuildPackages are the host packages a kernel build needs.
func KernelBuildPackages() []string { return kernel.BuildPackages() }

// kernelInfo is ListKernels' row for version.
func (s *Service) kernelInfo(ctx context.Context, version string) (*KernelInfo, error) {
	rows, err := s.ListKernels(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		if r.Version == version {
			return &r, nil
		}
	}
	return nil, fmt.Errorf("kernel %s: not in the cache: %w", version, errdefs.ErrNotFound)
}
