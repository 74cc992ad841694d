package supervisor

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
)

// watchOwner returns a channel closed when the owning CLI is gone (end of
// file on Options.Owner), or nil (never ready) for a sandbox nobody owns.
// The owner's pipe carries no data: only its end matters, and the kernel
// delivers that however the owner died.
func (s *Supervisor) watchOwner() <-chan struct{} {
	if s.opts.Owner == nil {
		return nil
	}
	gone := make(chan struct{})
	s.defer_(s.opts.Owner.Close)
	go func() {
		_, _ = io.Copy(io.Discard, s.opts.Owner)
		close(gone)
	}()
	return gone
}

// discard ends a throwaway sandbox (`smx run`'s, asked by its CLI, or
// whose CLI died) and has it removed before this supervisor exits. The
// status reads removing before discard returns, so the CLI can exit at
// once: `smx agent ls` hides a removing sandbox whose supervisor is alive,
// and readers of its name or log wait for it (internal/service). The
// machine is killed rather than shut down, since its disk goes next.
// It reports false when the machine was already being ended otherwise.
func (s *Supervisor) discard(reason string) bool {
	return s.finish(sandbox.EventDiscarded, func() {
		s.discarded = true
		s.cancelBg()
		s.machine.Kill()
		<-s.machine.Done()
		s.audit(audit.KindSandboxStop, map[string]any{"timeout_ms": 0})
		f := map[string]any{"status": string(sandbox.StatusStopped)}
		if reason != "" {
			f["reason"] = reason
		}
		s.audit(audit.KindSandboxRemove, f)
		if err := s.update(func(st *sandbox.State) {
			st.Stopped = time.Now()
			st.QEMUPID = 0
		}); err != nil {
			s.log.Error("write state", "err", err) // the sandbox is removed next
		}
	})
}

// handleDiscard answers supproto.OpDiscard: as `rm -f` would be, checked
// against the state table, then discard.
func (s *Supervisor) handleDiscard() error {
	if _, err := s.check(sandbox.OpForceRemove); err != nil {
		return err
	}
	s.trace("discard")
	if !isDone(s.stopping) && len(s.spec.Caches) > 0 {
		// A `smx run` that ended: its read-only caches take what the host
		// verifies before the machine goes (the caller waits for it).
		pctx, cancel := context.WithTimeout(context.Background(), promoteTimeout)
		s.promoteCaches(pctx)
		cancel()
	}
	if !s.discard("") {
		return fmt.Errorf("sandbox %s is already stopping: %w", s.spec.Name, errdefs.ErrFailed)
	}
	// The sandbox goes all the same; its caller learns that its state
	// could not say so meanwhile.
	return s.viaErr
}

// retire removes a discarded sandbox while this supervisor still holds its
// lock, and returns the tombstone to delete once the supervisor has let
// go of everything. The log is closed first, so its last records and its
// final signed checkpoint are written before the sandbox disappears; the
// directory is then renamed away under the sandboxes lock. A reader thus
// sees the sandbox removing with a live supervisor, or not at all; a
// crash before the rename leaves it removing without one, which `ls`
// shows and `rm -f` finishes.
func (s *Supervisor) retire() string {
	if <-s.logOpen; s.log_ != nil {
		if err := s.log_.Close(); err != nil {
			s.log.Error("close log", "err", err)
		}
	}
	m := &sandbox.Manager{State: s.opts.State}
	lock, err := m.LockAll()
	if err != nil {
		s.log.Error("remove discarded sandbox", "err", err)
		return ""
	}
	defer lock.Unlock()
	if fi, err := os.Stat(s.paths.Dir); err != nil || s.ownedDir == nil || !os.SameFile(fi, s.ownedDir) {
		return "" // removed already
	}
	tomb := filepath.Join(s.opts.State.Sandboxes(), fmt.Sprintf(".rm-%s-%d", s.opts.Name, time.Now().UnixNano()))
	if err := os.Rename(s.paths.Dir, tomb); err != nil {
		s.log.Error("remove discarded sandbox", "err", err)
		return ""
	}
	return tomb
}

// removeSelf deletes the sandbox once this supervisor has let go of it
// (lock released, log closed), as `smx agent rm` would: for a boot that
// failed after its owner died.
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
