package supervisor

import (
	"io"
	"os"

	"smx/internal/sandbox"
)

// watchOwner returns a channel closed when the owning CLI is gone (end of
// file on Options.Owner), or nil (never ready) for a sandbox nobody owns.
// The owner's pipe carries no data: only its end matters, and the kernel
// delivers that however the owner died.
//
// It also notes which directory the sandbox is, so removeSelf never
// removes a new sandbox that took the name.
func (s *Supervisor) watchOwner() <-chan struct{} {
	if s.opts.Owner == nil {
		return nil
	}
	gone := make(chan struct{})
	s.ownedDir, _ = os.Stat(s.paths.Dir)
	s.defer_(s.opts.Owner.Close)
	go func() {
		_, _ = io.Copy(io.Discard, s.opts.Owner)
		close(gone)
	}()
	return gone
}

// removeSelf deletes the sandbox once this supervisor has let go of it
// (lock released, log closed), as `smx agent rm` would.
func (s *Supervisor) removeSelf() {
	m := &sandbox.Manager{State: s.opts.State}
	lock, err := m.LockAll()
	if err != nil {
		s.log.Error("remove after owner exit", "err", err)
		return
	}
	defer lock.Unlock()
	if sandbox.SupervisorAlive(s.paths) {
		return // started again meanwhile: no longer ours to remove
	}
	if fi, err := os.Stat(s.paths.Dir); err != nil || s.ownedDir == nil || !os.SameFile(fi, s.ownedDir) {
		return // removed already (by the owner), or a new sandbox of the same name
	}
	if err := m.Remove(s.opts.Name); err != nil {
		s.log.Error("remove after owner exit", "err", err)
	}
}
