package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/image"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/supproto"
	"github.com/smx-dev/smx/internal/vm"
)

// Audit kinds for the run-state changes that have no kind of their own in
// internal/audit.
const (
	kindPause   = "sandbox.pause"
	kindResume  = "sandbox.resume"
	kindSuspend = "sandbox.suspend"
)

// restorePlan says where a run loads its saved state from.
type restorePlan struct {
	label     string // "suspend" or "snapshot NAME", for logs and errors
	snapshot  string // snapshot name; "" for a suspend or a template
	template  string // boot template name (see template.go)
	statePath string
	ramFile   string // a template's RAM, when statePath holds its devices alone (slimTemplate)
	hostPath  string // JSON holding the snapshot.Host the state needs
	discard   bool   // remove the state once it is loaded (suspend)
	// What the saved guest already trusts (a template's CAs, see
	// adoptTemplateCAs): syncGuest does not install it again.
	guestCA    []byte
	guestSSHCA string
}

// planRestore decides between booting and loading a saved state: a
// suspended sandbox resumes from suspend.state; a sandbox made from a
// snapshot loads the snapshot on its first start (later starts boot its
// disk, as any sandbox's).
func (s *Supervisor) planRestore() error {
	if _, err := os.Stat(s.paths.SuspendState()); err == nil {
		s.restore = &restorePlan{label: "suspend", statePath: s.paths.SuspendState(), hostPath: s.paths.SuspendHost(), discard: true}
		return nil
	}
	in, err := (&sandbox.Manager{State: s.opts.State}).Get(s.opts.Name)
	if err != nil {
		return err
	}
	s.firstStart = in.State.Status == sandbox.StatusCreated
	if s.spec.Snapshot != "" && in.State.Status == sandbox.StatusCreated {
		sn, err := (&snapshot.Store{Dir: s.opts.State.Snapshots()}).Get(s.spec.Snapshot)
		if err != nil {
			return err
		}
		s.restore = &restorePlan{label: "snapshot " + sn.Name, snapshot: sn.Name, statePath: sn.MemoryPath(), hostPath: sn.MetaPath()}
	}
	return nil
}

// open checks that this host can load the state and opens it; firmware
// is the ROM the state was saved with, which the machine must start.
func (p *restorePlan) open(cur snapshot.Host) (f *os.File, firmware string, err error) {
	saved, err := snapshot.ReadHost(p.hostPath)
	if err != nil {
		return nil, "", fmt.Errorf("supervisor: restore from %s: %w", p.label, err)
	}
	if err := saved.Check(cur); err != nil {
		return nil, "", fmt.Errorf("supervisor: restore from %s: %w", p.label, err)
	}
	f, err = os.Open(p.statePath)
	if err != nil {
		return nil, "", fmt.Errorf("supervisor: restore from %s: %w", p.label, err)
	}
	firmware = saved.Firmware
	if firmware == "" {
		firmware = vm.FirmwareSeaBIOS
	}
	return f, firmware, nil
}

// restored finishes a successful restore: the log records it, and a
// suspend's state file, now loaded, is deleted.
func (s *Supervisor) restored() {
	p := s.restore
	if p.discard {
		os.Remove(p.statePath)
		os.Remove(p.hostPath)
	}
	if p.template != "" {
		return // a template stands in for a boot: sandbox.start says restored_from
	}
	f := map[string]any{"restore_ms": s.state.BootMS, "profile": s.spec.Profile, "profile_hash": s.spec.ProfileHash}
	if p.snapshot == "" {
		f["from"] = "suspend"
		s.audit(kindResume, f)
		return
	}
	f["snapshot"] = p.snapshot
	if sn, err := (&snapshot.Store{Dir: s.opts.State.Snapshots()}).Get(p.snapshot); err == nil {
		f["snapshot_source"] = sn.Source
		if sn.ProfileHash != s.spec.ProfileHash {
			f["snapshot_profile_hash"] = sn.ProfileHash
		}
	}
	s.audit(audit.KindSnapshotRestore, f)
}

// currentHost describes what a state saved here depends on. QEMU's
// version is remembered in the state directory (keyed by the binary).
func currentHost(ctx context.Context, state statedir.Dir, kernelVersion, initrd string, accel vm.Accel) (snapshot.Host, error) {
	v, err := vm.QEMUVersionCached(ctx, "", filepath.Join(state.Root, "cache", "qemu-version"))
	if err != nil {
		return snapshot.Host{}, err
	}
	h := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(initrd), "initramfs-"), ".cpio")
	cpu, flags := vm.CPUOf(accel)
	return snapshot.Host{QEMUVersion: v, Kernel: kernelVersion, InitramfsHash: h, Accel: string(accel),
		Machine: vm.MachineType, CPU: cpu, CPUFlags: flags, Firmware: vm.Firmware}, nil
}

// sessionConn is the control channel as one yamux session sees it. Its
// Close does not close the channel, which QEMU holds the other end of and
// cannot reconnect: it only unblocks the session's reads and writes, so a
// new session can take over the same channel.
type sessionConn struct{ net.Conn }

func (c sessionConn) Close() error { return c.Conn.SetDeadline(time.Unix(1, 0)) }

// newSession starts a fresh yamux client on the control channel,
// replacing the previous one; once endSessions has run it does nothing.
func (s *Supervisor) newSession() {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if s.sessionsEnded {
		return
	}
	if s.session != nil {
		s.session.Close() // returns once its reader has stopped
	}
	s.ctlConn.SetDeadline(time.Time{})
	ycfg := yamux.DefaultConfig()
	// The guest may sit paused or be slow under TCG; keepalives would
	// tear the session down, and the channel cannot silently drop.
	ycfg.EnableKeepAlive = false
	ycfg.ConnectionWriteTimeout = 5 * time.Minute
	ycfg.MaxStreamWindowSize = 4 << 20
	ycfg.LogOutput = io.Discard
	// yamux.Client fails only on a bad config.
	s.session, _ = yamux.Client(sessionConn{s.ctlConn}, ycfg)
}

// currentSession is the control session to the guest, nil before the
// guest first answered or after endSessions.
func (s *Supervisor) currentSession() *yamux.Session {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	if s.sessionsEnded {
		return nil
	}
	return s.session
}

// endSessions closes the control session for good: the guest is gone or
// the supervisor exits. A boot goroutine that reaches newSession later
// (waitGuest gave up on it) starts none.
func (s *Supervisor) endSessions() {
	s.sessMu.Lock()
	defer s.sessMu.Unlock()
	s.sessionsEnded = true
	if s.session != nil {
		s.session.Close()
	}
}

// reconnectGuest opens a control session to a guest restored from a saved
// state, and syncs the guest (syncGuest). The guest's agent still holds the yamux session of the
// supervisor that saved it, and the channel may carry the tail of that
// session's output; so the old session is ended with poison bytes and the
// new one starts after the guest's hello (see agentproto.SessionHello).
// Streams that were open at save time end there: their processes are
// killed as when any exec client goes away; processes not tied to a stream
// keep running.
func (s *Supervisor) reconnectGuest(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.BootTimeout)
	defer cancel()
	if err := s.awaitHello(ctx, true); err != nil {
		if isDone(s.machine.Done()) {
			return fmt.Errorf("supervisor: QEMU exited after restore (%v): %s", s.machine.Wait(), lastLine(s.machine.Stderr()))
		}
		return fmt.Errorf("supervisor: guest agent did not answer after restore from %s: %w: %w", s.restore.label, err, errdefs.ErrUnavailable)
	}
	s.trace("hello")
	s.newSession()
	// Setting the clock proves the new session works; the guest's
	// identity is set on streams of their own meanwhile.
	if err := s.syncGuest(ctx, true); err != nil {
		return fmt.Errorf("supervisor: guest agent after restore from %s: %w", s.restore.label, err)
	}
	s.log.Info("guest reconnected")
	return nil
}

// awaitHello reads the control channel up to and including the guest's
// next session hello, discarding what comes before. It never reads past
// the hello, whose next bytes belong to the new session. With poison it
// keeps sending poison bytes until the hello arrives, to end a stale
// session that may even be waiting for the rest of a cut frame.
func (s *Supervisor) awaitHello(ctx context.Context, poison bool) error {
	conn := s.ctlConn
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	defer func() {
		stop()
		conn.SetReadDeadline(time.Time{})
	}()
	done := make(chan struct{})
	poisoned := make(chan struct{})
	if poison {
		go func() {
			defer close(poisoned)
			burst := make([]byte, 4096)
			for i := range burst {
				burst[i] = agentproto.SessionPoison
			}
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for {
				conn.SetWriteDeadline(time.Now().Add(time.Second))
				conn.Write(burst)
				select {
				case <-done:
					conn.SetWriteDeadline(time.Time{})
					return
				case <-t.C:
				}
			}
		}()
	} else {
		close(poisoned)
	}
	defer func() { close(done); <-poisoned }()

	hello := []byte(agentproto.SessionHello)
	var tail []byte // the last bytes read, at most len(hello)
	buf := make([]byte, len(hello))
	discarded := 0
	for {
		// Read no more than could complete the hello.
		k := matchedPrefix(tail, hello)
		n, err := conn.Read(buf[:len(hello)-k])
		tail = append(tail, buf[:n]...)
		if len(tail) > len(hello) {
			discarded += len(tail) - len(hello)
			tail = tail[len(tail)-len(hello):]
		}
		if string(tail) == agentproto.SessionHello {
			if discarded > 0 {
				s.log.Info("discarded stale control channel bytes", "bytes", discarded)
			}
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("control channel: %w", err)
		}
	}
}

// matchedPrefix is the length of the longest suffix of b that is a prefix
// of p.
func matchedPrefix(b, p []byte) int {
	for k := min(len(b), len(p)); k > 0; k-- {
		if string(b[len(b)-k:]) == string(p[:k]) {
			return k
		}
	}
	return 0
}

func (s *Supervisor) paused() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := s.machine.Status(ctx)
	return err == nil && st != "running"
}

// control answers the run-state requests the supervisor handles itself.
func (s *Supervisor) control(req *supproto.Request) (*supproto.Result, error) {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.stateMu.Lock()
	in := &sandbox.Info{Spec: s.spec, State: s.state}
	s.stateMu.Unlock()
	status := in.State.Status
	// The one state table decides, against the status this supervisor
	// holds (the caller checked it against state.json before).
	op, ok := served[req.Op]
	if !ok || op == "" {
		return nil, fmt.Errorf("supervisor: unknown op %q: %w", req.Op, errdefs.ErrInvalid)
	}
	t, err := sandbox.Check(in, op)
	if err != nil {
		return nil, err
	}
	if t.NoOp {
		return &supproto.Result{OK: true}, nil
	}
	if status == sandbox.StatusBlocked && req.Op == supproto.OpResume {
		ctx, cancel := context.WithTimeout(s.bgCtx, time.Minute)
		defer cancel()
		start := time.Now()
		if err := s.unblock(ctx); err != nil {
			return nil, err
		}
		s.background(func(ctx context.Context) { s.syncGuest(ctx, false) })
		d := time.Since(start)
		s.audit(kindResume, map[string]any{"duration_ms": d.Milliseconds(), "from": "blocked"})
		return &supproto.Result{OK: true, DurationMS: d.Milliseconds()}, nil
	}
	// A stop cancels bgCtx: a long save is then abandoned, not waited for.
	ctx, cancel := context.WithTimeout(s.bgCtx, 10*time.Minute)
	defer cancel()
	start := time.Now()
	switch req.Op {
	case supproto.OpPause:
		if err := s.machine.Pause(ctx); err != nil {
			return nil, fmt.Errorf("supervisor: pause: %w", err)
		}
		if err := s.apply(sandbox.EventPaused, nil); err != nil {
			return nil, fmt.Errorf("supervisor: pause: %w", err)
		}
		d := time.Since(start)
		s.audit(kindPause, map[string]any{"duration_ms": d.Milliseconds()})
		return &supproto.Result{OK: true, DurationMS: d.Milliseconds()}, nil
	case supproto.OpResume:
		if err := s.machine.Cont(ctx); err != nil {
			return nil, fmt.Errorf("supervisor: resume: %w", err)
		}
		if err := s.apply(sandbox.EventResumed, nil); err != nil {
			return nil, fmt.Errorf("supervisor: resume: %w", err)
		}
		d := time.Since(start)
		// The guest's clock stood still while it was paused.
		s.background(func(ctx context.Context) { s.syncGuest(ctx, false) })
		s.audit(kindResume, map[string]any{"duration_ms": d.Milliseconds(), "from": "pause"})
		return &supproto.Result{OK: true, DurationMS: d.Milliseconds()}, nil
	case supproto.OpSuspend:
		return s.suspend(ctx, status)
	case supproto.OpSnapshot:
		return s.snapshot(ctx, req, status)
	}
	return nil, fmt.Errorf("supervisor: unknown op %q: %w", req.Op, errdefs.ErrInvalid)
}

// saveState pauses the guest (when it runs) and writes its state to path.
func (s *Supervisor) saveState(ctx context.Context, path string) (int64, error) {
	if err := s.machine.Pause(ctx); err != nil {
		return 0, fmt.Errorf("supervisor: save: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("supervisor: save: %w", err)
	}
	err = s.machine.SaveState(ctx, f, nil)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// undoSave lets a guest that was running before a failed save run again.
func (s *Supervisor) undoSave(wasRunning bool) {
	if !wasRunning || isDone(s.machine.Done()) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.machine.Cont(ctx); err != nil {
		s.log.Error("resume after failed save", "err", err)
	}
}

func (s *Supervisor) suspend(ctx context.Context, status sandbox.Status) (*supproto.Result, error) {
	start := time.Now()
	wasRunning := status == sandbox.StatusRunning
	tmp := s.paths.SuspendState() + ".tmp"
	n, err := s.saveState(ctx, tmp)
	if err == nil {
		err = snapshot.WriteHost(s.paths.SuspendHost(), s.host)
	}
	if err == nil {
		err = os.Rename(tmp, s.paths.SuspendState())
	}
	if err != nil {
		os.Remove(tmp)
		os.Remove(s.paths.SuspendHost())
		s.undoSave(wasRunning)
		return nil, fmt.Errorf("supervisor: suspend: %w (the sandbox keeps running)", err)
	}
	d := time.Since(start)
	ok := s.shutdown(func() {
		qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		s.machine.Quit(qctx)
		cancel()
		s.audit(kindSuspend, map[string]any{"state_bytes": n, "duration_ms": d.Milliseconds()})
		if err := s.apply(sandbox.EventSuspended, func(st *sandbox.State) {
			st.Stopped = time.Now()
			st.QEMUPID = 0
			st.SupervisorPID = 0
		}); err != nil {
			s.stopErr = errors.Join(s.stopErr, err)
		}
	})
	if !ok {
		os.Remove(s.paths.SuspendState())
		return nil, fmt.Errorf("supervisor: suspend: the sandbox is stopping: %w", errdefs.ErrFailed)
	}
	<-s.stopDone
	if s.stopErr != nil {
		// The saved state stays: the next start restores it.
		return nil, fmt.Errorf("supervisor: suspend: the guest's state is saved, but: %w", s.stopErr)
	}
	return &supproto.Result{OK: true, Bytes: n, DurationMS: d.Milliseconds()}, nil
}

func (s *Supervisor) snapshot(ctx context.Context, req *supproto.Request, status sandbox.Status) (*supproto.Result, error) {
	store := &snapshot.Store{Dir: s.opts.State.Snapshots()}
	b, err := store.Begin(req.Snapshot)
	if err != nil {
		return nil, err
	}
	defer b.Abort()
	start := time.Now()
	wasRunning := status == sandbox.StatusRunning
	n, err := s.saveState(ctx, b.MemoryPath())
	if err == nil {
		// The guest is stopped and QEMU has flushed the disk: its overlay
		// now matches the memory state.
		err = snapshot.CopyFile(b.DiskPath(), s.paths.Disk())
	}
	if err == nil {
		err = snapshot.CopyFile(b.ProfilePath(), s.paths.Profile())
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
	}
	if err != nil {
		b.Abort()
		s.undoSave(wasRunning)
		return nil, fmt.Errorf("supervisor: snapshot %s: %w (nothing was saved)", req.Snapshot, err)
	}
	paused := time.Since(start)
	if req.StopAfter {
		s.shutdown(func() {
			qctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.machine.Quit(qctx)
			cancel()
			s.audit(audit.KindSandboxStop, map[string]any{"after": "snapshot " + req.Snapshot})
			if err := s.apply(sandbox.EventStopped, func(st *sandbox.State) {
				st.Stopped = time.Now()
				st.QEMUPID = 0
				st.SupervisorPID = 0
			}); err != nil {
				s.stopErr = errors.Join(s.stopErr, err)
			}
		})
	} else if wasRunning {
		if err := s.machine.Cont(ctx); err != nil {
			return nil, fmt.Errorf("supervisor: snapshot %s: resume: %w", req.Snapshot, err)
		}
		s.background(func(ctx context.Context) { s.syncGuest(ctx, false) })
	}
	meta := snapshot.Snapshot{
		Source: s.spec.Name, Parent: s.spec.Snapshot, Template: s.spec.Template, Created: time.Now().UTC(),
		Image: s.spec.Image, ImageBase: s.spec.ImageBase, Host: s.host,
		Profile: s.spec.Profile, ProfileHash: s.spec.ProfileHash,
		CPUs: s.spec.CPUs, MemoryMiB: s.spec.MemoryMiB, DiskBytes: s.spec.DiskBytes, Env: s.spec.Env,
		SaveMS: paused.Milliseconds(), Mounts: s.mountStrings(), Ports: s.portStrings(), Worktree: s.spec.Worktree,
	}
	if s.spec.Timeout > 0 {
		meta.Timeout = s.spec.Timeout.String()
	}
	if s.spec.IdleStop > 0 {
		meta.IdleStop = s.spec.IdleStop.String()
	}
	if img, err := (&image.Store{Dir: s.opts.State.Images()}).Get(s.spec.Image); err == nil {
		meta.ImageDigest = img.Digest
	}
	sn, err := b.Commit(meta)
	if req.StopAfter {
		<-s.stopDone
	}
	if err != nil {
		return nil, err
	}
	s.audit(audit.KindSnapshotCreate, map[string]any{
		"snapshot": sn.Name, "memory_digest": sn.MemoryDigest, "disk_digest": sn.DiskDigest,
		"memory_state_bytes": sn.MemoryStateBytes, "disk_file_bytes": sn.DiskFileBytes,
		"paused_ms": sn.SaveMS, "profile_hash": sn.ProfileHash, "stop": req.StopAfter,
	})
	if req.StopAfter && s.stopErr != nil {
		return nil, fmt.Errorf("supervisor: snapshot %s is saved, but the stop after it: %w", sn.Name, s.stopErr)
	}
	return &supproto.Result{OK: true, Bytes: n, DurationMS: paused.Milliseconds()}, nil
}
