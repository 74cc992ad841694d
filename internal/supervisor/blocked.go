package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/vm/qmp"
)

// When the host's disk fills, QEMU stops the guest (the default werror=
// enospc) and reports BLOCK_IO_ERROR; its status becomes io-error. The
// supervisor turns that into the sandbox state "blocked" with where the
// disk is full, a sandbox.blocked record, and a resume that retries. To
// be able to write that state and record on a full disk, it keeps a small
// reserve file beside the sandbox's disk and frees it first.

// reserveSize is enough for state.json, a few log records and a checkpoint.
const reserveSize = 1 << 20

func (s *Supervisor) reservePath() string { return filepath.Join(s.paths.Dir, "reserve") }

// makeReserve allocates the reserve; an error means the disk has no room.
func (s *Supervisor) makeReserve() error {
	f, err := os.OpenFile(s.reservePath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, reserveSize); err != nil {
		if err != unix.EOPNOTSUPP {
			os.Remove(f.Name())
			return err
		}
		// No fallocate here: write the blocks.
		if _, err := f.WriteAt(make([]byte, reserveSize), 0); err != nil {
			os.Remove(f.Name())
			return err
		}
	}
	return f.Sync()
}

// watchBlocks follows QEMU's events for I/O errors that stopped the guest,
// until the machine is gone. Events only reach the QMP connection open at
// the time, so it also asks QEMU's run state every few seconds: a guest
// stopped in io-error is blocked whether or not its event was seen.
func (s *Supervisor) watchBlocks() {
	poll := time.NewTicker(3 * time.Second)
	defer poll.Stop()
	for !isDone(s.machine.Done()) && !isDone(s.stopping) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := s.machine.QMP(ctx)
		cancel()
		if err != nil {
			select {
			case <-s.machine.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
	events:
		for {
			select {
			case ev, ok := <-c.Events():
				if !ok {
					break events // connection lost: dial again
				}
				if ev.Name == "BLOCK_IO_ERROR" {
					s.onIOError(ev)
				}
			case <-poll.C:
				s.pollIOError()
			case <-s.machine.Done():
				return
			}
		}
	}
}

// pollIOError blocks the sandbox when QEMU says the guest is stopped on an
// I/O error that no event reported.
func (s *Supervisor) pollIOError() {
	if _, err := sandbox.Next(s.status(), sandbox.EventBlocked); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	st, err := s.machine.Status(ctx)
	cancel()
	if err != nil || st != "io-error" {
		return
	}
	e := ioError{Action: "stop", Operation: "write", Reason: "QEMU reports io-error"}
	var fs unix.Statfs_t
	if unix.Statfs(s.paths.Dir, &fs) == nil && int64(fs.Bavail)*fs.Bsize < 64<<20 {
		e.Nospace, e.Reason = true, "No space left on device"
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.block(e)
}

// ioError is the data of QEMU's BLOCK_IO_ERROR event.
type ioError struct {
	Device    string `json:"device"`
	NodeName  string `json:"node-name"`
	Operation string `json:"operation"`
	Action    string `json:"action"` // stop, report, ignore
	Nospace   bool   `json:"nospace"`
	Reason    string `json:"reason"`
}

func (s *Supervisor) onIOError(ev qmp.Event) {
	var e ioError
	if json.Unmarshal(ev.Data, &e) != nil || e.Action != "stop" {
		return // reported to the guest, which deals with it
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.block(e)
}

// block records that the guest is stopped on e. The caller holds opMu.
func (s *Supervisor) block(e ioError) {
	if _, err := sandbox.Next(s.status(), sandbox.EventBlocked); err != nil {
		return // already blocked (one event per failed request), or stopping
	}
	// QEMU reports the error before it stops the guest, and its other
	// requests in flight still write until the stop has drained them:
	// freed any sooner, the reserve's room would go to them (seen in CI:
	// the blocked state then could not be written).
	s.awaitStopped()
	os.Remove(s.reservePath()) // room for the state and the record
	msg := fmt.Sprintf("host disk full at %s: free space there, then `smx agent resume %s`", s.paths.Dir, s.spec.Name)
	if !e.Nospace {
		msg = fmt.Sprintf("host I/O error on the sandbox's disk (%s): fix it, then `smx agent resume %s`", e.Reason, s.spec.Name)
	}
	s.log.Error("guest stopped on a host I/O error", "reason", e.Reason, "nospace", e.Nospace)
	// Nobody asked for this: a state that cannot be written even with
	// the reserve's room is only logged; a resume will write it.
	if err := s.apply(sandbox.EventBlocked, func(st *sandbox.State) { st.Error = msg }); err != nil {
		s.log.Error("write blocked state", "err", err)
	}
	s.audit(audit.KindSandboxBlocked, map[string]any{
		"device": e.Device, "operation": e.Operation, "nospace": e.Nospace, "reason": e.Reason,
		"disk": s.paths.Disk(),
	})
}

// awaitStopped waits, up to 5 s, until QEMU no longer reports the guest
// running. QEMU answers QMP only between main-loop iterations, so once it
// reports the guest stopped, its stop has drained the disk's requests.
func (s *Supervisor) awaitStopped() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		st, err := s.machine.Status(ctx)
		if err != nil || st != "running" {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// unblock is resume for a blocked sandbox: it fails at once while there is
// still no room for the reserve, and otherwise lets QEMU retry the failed
// request, which stops the guest again if the disk is still full. The
// caller holds opMu.
func (s *Supervisor) unblock(ctx context.Context) error {
	if err := s.makeReserve(); err != nil {
		return fmt.Errorf("sandbox %s is still blocked: host disk full at %s (%v): free space there, then resume again: %w",
			s.spec.Name, s.paths.Dir, err, errdefs.ErrFailed)
	}
	if err := s.machine.Cont(ctx); err != nil {
		return fmt.Errorf("supervisor: resume: %w", err)
	}
	// QEMU retries at once; give a still-full disk the time to fail again.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		st, err := s.machine.Status(ctx)
		if err == nil && st == "io-error" {
			os.Remove(s.reservePath())
			return fmt.Errorf("sandbox %s is still blocked: host disk full at %s: free more space, then resume again: %w",
				s.spec.Name, s.paths.Dir, errdefs.ErrFailed)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return s.apply(sandbox.EventUnblocked, func(st *sandbox.State) { st.Error = "" })
}
