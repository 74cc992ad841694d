package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/statedir"
)

// recordCrash is run by whoever first sees that a sandbox's supervisor died
// without saying so (a kill -9, an OOM kill): `smx agent ls`, start, rm...
// It appends sandbox.crash to the sandbox's log and writes the crashed
// state, so the crash is recorded exactly once: observers take turns, a
// new supervisor waits for the one recording, and the next observer finds
// state.json already saying crashed.
//
// It is best effort: when the lock or the log cannot be had (a supervisor
// is starting, another observer is recording), the caller still reports
// the sandbox as crashed.
func (m *Manager) recordCrash(name string, p Paths, dead, crashed State) {
	// A shared hold of the supervisor lock keeps a new supervisor from
	// starting meanwhile (it waits for an exclusive one) without looking
	// like a live supervisor to other observers, whose Held probe is
	// shared too. Observers then take turns on crash.lock.
	sup, err := os.Open(p.Lock())
	if err != nil {
		return
	}
	defer sup.Close()
	if unix.Flock(int(sup.Fd()), unix.LOCK_SH|unix.LOCK_NB) != nil {
		return // a supervisor is starting
	}
	lock, err := statedir.LockFile(filepath.Join(p.Dir, "crash.lock"))
	if err != nil {
		return
	}
	defer lock.Unlock()
	cur, err := readState(p)
	if err != nil || cur.Status != dead.Status || cur.SupervisorPID != dead.SupervisorPID {
		return // someone else recorded it, or a new supervisor ran meanwhile
	}
	key, err := audit.LoadOrCreatePinnedKey(m.State.Audit())
	if err == nil {
		var l *audit.Log
		if l, err = audit.Open(audit.Dir(m.State.Logs(), name), name, key.Signer()); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err = l.Append(ctx, audit.KindSandboxCrash, map[string]any{
				"phase":          "supervisor",
				"error":          fmt.Sprintf("supervisor (pid %d) died while the sandbox was %s", dead.SupervisorPID, dead.Status),
				"supervisor_pid": dead.SupervisorPID,
				"qemu_pid":       dead.QEMUPID,
			})
			cancel()
			if cerr := l.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		// Leave state.json as it is, so a later observer tries again.
		return
	}
	_, _ = Update(p, crashed, func(st *State) {
		st.Stopped = time.Now()
		st.QEMUPID = 0
	})
}
