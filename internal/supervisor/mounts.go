package supervisor

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/fsgw"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/supproto"
	"github.com/smx-dev/smx/internal/vm"
)

// Mounts added to and removed from a running sandbox (`smx agent mount
// add|rm`). They ride the sandbox's one virtio-fs device, so nothing is
// hotplugged (microvm has no hotplug): a new mount is a new directory of
// the device's root, which the guest agent binds in place; a removed one
// is unbound in the guest and its tree dropped on the host.

// handleMount adds or removes a mount and answers with the mounts served
// afterwards.
func (s *Supervisor) handleMount(c io.Writer, req *supproto.Request) {
	var err error
	if req.Op == supproto.OpMountAdd {
		err = s.addMount(req.Volume)
	} else {
		err = s.removeMount(req.Path)
	}
	if err != nil {
		supproto.WriteError(c, err)
		return
	}
	s.shares.mu.Lock()
	var out []string
	for _, sh := range s.shares.list {
		out = append(out, sandbox.Mount{Host: sh.host, Guest: sh.mount.Guest, ReadOnly: sh.mount.ReadOnly,
			UID: sh.owner.UID, GID: sh.owner.GID, Unprotected: sh.mount.Unprotected}.String())
	}
	s.shares.mu.Unlock()
	supproto.WriteResult(c, supproto.Result{OK: true, Mounts: out})
}

// liveMountsUnavailable says why this sandbox cannot change its mounts
// while it runs, or nil when it can.
func (s *Supervisor) liveMountsUnavailable() error {
	if s.vfs != nil {
		return nil
	}
	if !vm.VirtioFSCapable(s.host.QEMUVersion) {
		return fmt.Errorf("supervisor: mounts are added to a running sandbox over virtio-fs, which needs QEMU 8.2 or newer (this host runs %s; Debian 12: apt-get install -t bookworm-backports qemu-system-x86, see docs/install.md): give the mount as -v when you create the sandbox instead: %w",
			s.host.QEMUVersion, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("supervisor: sandbox %s has no virtio-fs device (it started without mounts, or with mounts over 9P): stop it, then start it again with a -v mount (smx agent create -v) to add more mounts while it runs: %w",
		s.spec.Name, errdefs.ErrUnavailable)
}

func (s *Supervisor) addMount(volume string) error {
	if err := s.liveMountsUnavailable(); err != nil {
		return err
	}
	m, err := sandbox.ParseMount(volume)
	if err != nil {
		return err
	}
	// opMu: a snapshot reads the spec's mounts under it, and two changes
	// must not interleave.
	s.opMu.Lock()
	defer s.opMu.Unlock()
	rule := "-v " + m.String()
	s.shares.mu.Lock()
	taken := slices.IndexFunc(s.shares.list, func(sh *share) bool { return sh.mount.Guest == m.Guest })
	var prev string
	if taken >= 0 {
		prev = s.shares.list[taken].mount.Rule
	}
	tag := "m" + strconv.Itoa(s.shares.nextTag)
	s.shares.nextTag++
	s.shares.mu.Unlock()
	if taken >= 0 {
		return fmt.Errorf("supervisor: %s is already mounted (%s): remove it first with smx agent mount rm %s %s: %w", m.Guest, prev, s.spec.Name, m.Guest, errdefs.ErrExists)
	}
	if err := checkGitDir(m.Host, m.Guest, m.ReadOnly, m.Unprotected, rule); err != nil {
		return err
	}
	fm := policy.FileMount{Guest: m.Guest, ReadOnly: m.ReadOnly, Unprotected: m.Unprotected, Rule: rule}
	// The profile decides the mount point as it decides any path under
	// it: a mount the rules deny would only show an empty, unusable
	// directory, so it is refused, and recorded as a refusal.
	if prof := s.shares.profile.Load(); prof != nil {
		if d := prof.DecideMounted(fm, m.Guest, "ro"); !d.Allow {
			s.audit(audit.KindFileRefused, map[string]any{"op": "mount", "path": m.Guest, "host": m.Host, "mount": m.Guest, "rule": d.Rule, "reason": d.Reason})
			return fmt.Errorf("supervisor: mount %s at %s: the profile denies %s (%s): %w", m.Host, m.Guest, m.Guest, d.Rule, errdefs.ErrDenied)
		}
	}
	sh := &share{tag: tag, host: m.Host, mount: fm, owner: fsgw.Owner{UID: m.UID, GID: m.GID}}
	if sh.gw, err = s.newGateway(sh); err != nil {
		return err
	}
	root, err := sh.gw.Attach()
	if err != nil {
		sh.gw.Close()
		return fmt.Errorf("supervisor: mount %s: %w", rule, err)
	}
	s.vfs.AddMountAt(tag, m.Guest, root)
	undo := func() {
		s.vfs.RemoveMount(tag)
		sh.gw.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.guestMount(ctx, sh, &agentproto.MountRequest{Tag: tag, Path: m.Guest, ReadOnly: m.ReadOnly, VirtioFS: virtioFSTag}); err != nil {
		undo()
		return err
	}
	mounts := append(slices.Clone(s.spec.Mounts), m)
	if err := s.writeMounts(mounts); err != nil {
		// Served but not kept: serve what the spec says.
		s.guestUnmount(ctx, m.Guest)
		undo()
		return err
	}
	s.shares.mu.Lock()
	s.shares.list = append(s.shares.list, sh)
	s.shares.mu.Unlock()
	s.defer_(sh.gw.Close)
	s.spec.Mounts = mounts // the one field changed: readers of the others do not race
	s.audit(audit.KindMountAdd, map[string]any{"host": m.Host, "guest": m.Guest, "ro": m.ReadOnly, "rule": rule})
	return nil
}

func (s *Supervisor) removeMount(guest string) error {
	if err := s.liveMountsUnavailable(); err != nil {
		return err
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	i := slices.IndexFunc(s.spec.Mounts, func(m sandbox.Mount) bool { return m.Guest == guest })
	s.shares.mu.Lock()
	j := slices.IndexFunc(s.shares.list, func(sh *share) bool { return sh.mount.Guest == guest })
	var sh *share
	if j >= 0 {
		sh = s.shares.list[j]
	}
	s.shares.mu.Unlock()
	switch {
	case sh == nil:
		return fmt.Errorf("supervisor: nothing is mounted at %s: smx agent inspect %s lists the mounts: %w", guest, s.spec.Name, errdefs.ErrNotFound)
	case i < 0:
		return fmt.Errorf("supervisor: %s is mounted by the profile (%s): change the profile's files.mounts to remove it: %w", guest, sh.mount.Rule, errdefs.ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mounts := slices.Delete(slices.Clone(s.spec.Mounts), i, i+1)
	if err := s.writeMounts(mounts); err != nil {
		return err
	}
	// The guest unbinds first, so that no new path reaches the tree;
	// then the tree goes on the host, whatever the guest answered: what
	// it still holds open there (or a mount it refused to let go) fails
	// from the next operation on.
	gerr := s.guestUnmount(ctx, guest)
	s.vfs.RemoveMount(sh.tag)
	sh.gw.Close()
	s.shares.mu.Lock()
	s.shares.list = slices.DeleteFunc(s.shares.list, func(x *share) bool { return x == sh })
	s.shares.mu.Unlock()
	s.spec.Mounts = mounts
	f := map[string]any{"host": sh.host, "guest": guest, "ro": sh.mount.ReadOnly, "rule": sh.mount.Rule}
	if gerr != nil {
		f["guest_error"] = gerr.Error()
		s.log.Warn("guest unmount failed; the host dropped the mount anyway", "guest", guest, "err", gerr)
	}
	s.audit(audit.KindMountRemove, f)
	return nil
}

func (s *Supervisor) guestUnmount(ctx context.Context, guest string) error {
	_, err := s.call(ctx, &agentproto.Request{Op: agentproto.OpUnmount, Mount: &agentproto.MountRequest{Path: guest}})
	return err
}

// writeMounts changes the mounts in spec.json and nothing else, under the
// lock the service holds for its own spec changes.
func (s *Supervisor) writeMounts(mounts []sandbox.Mount) error {
	lock, err := (&sandbox.Manager{State: s.opts.State}).LockAll()
	if err != nil {
		return err
	}
	defer lock.Unlock()
	return sandbox.UpdateSpec(s.paths, func(sp *sandbox.Spec) { sp.Mounts = mounts })
}
