// The control socket (sup.sock): the server that checks each request of
// internal/supproto against the state table and serves it.

package supervisor

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/supproto"
)

func (s *Supervisor) listen() error {
	// Relative name: the supervisor's working directory is the sandbox
	// directory, and absolute paths may exceed the 108-byte sun_path.
	os.Remove("sup.sock")
	l, err := net.Listen("unix", "sup.sock")
	if err != nil {
		return fmt.Errorf("supervisor: listen: %w", err)
	}
	s.listener = l
	s.defer_(func() error { l.Close(); os.Remove("sup.sock"); return nil })
	return nil
}

func (s *Supervisor) serve() {
	for {
		c, err := s.listener.Accept()
		if err != nil {
			return
		}
		s.handlers.Add(1)
		go func() {
			defer s.handlers.Done()
			s.handle(c)
		}()
	}
}

// served is the state table's operation each request of supproto is
// checked against before the supervisor serves it (handle); "" for a
// request that changes nothing and needs nothing of the guest (the
// record of a refused copy, the list of published ports). A request
// missing here is refused.
var served = map[string]sandbox.Op{
	supproto.OpExec:       sandbox.OpExec,
	supproto.OpCopyIn:     sandbox.OpExec,
	supproto.OpCopyOut:    sandbox.OpExec,
	supproto.OpHealth:     sandbox.OpExec,
	supproto.OpStop:       sandbox.OpStop,
	supproto.OpDiscard:    sandbox.OpForceRemove,
	supproto.OpPause:      sandbox.OpPause,
	supproto.OpResume:     sandbox.OpResume,
	supproto.OpSuspend:    sandbox.OpSuspend,
	supproto.OpSnapshot:   sandbox.OpSnapshot,
	supproto.OpSetProfile: sandbox.OpPolicy,
	supproto.OpPortAdd:    sandbox.OpPort,
	supproto.OpPortRemove: sandbox.OpPort,
	supproto.OpPortList:   "",
	// A mount is bound in the guest, so it needs a running guest, as
	// an exec does.
	supproto.OpMountAdd:    sandbox.OpExec,
	supproto.OpMountRemove: sandbox.OpExec,
	supproto.OpCopyRefused: "",
	supproto.OpSSH:         sandbox.OpExec,
	// Listing questions changes nothing; an answer may change the
	// profile ("always"), so it is decided as a policy change.
	supproto.OpApprovals: "",
	supproto.OpApprove:   sandbox.OpPolicy,
}

// handle serves one client connection (internal/supproto). Every request
// is first checked against the state table (served), so that a paused or
// stopping sandbox refuses what it cannot do with the table's words. The
// requests the supervisor carries out are answered here; the rest reach
// the guest only as supproto.ToGuest rebuilds them, so a client can never
// send the guest agent a request the supervisor alone may make (set the
// clock, install a CA, mount a share, power off).
func (s *Supervisor) handle(c net.Conn) {
	defer c.Close()
	req, err := supproto.ReadRequest(c)
	if err != nil {
		if !errors.Is(err, io.EOF) {
			supproto.WriteError(c, err)
		}
		return
	}
	op, ok := served[req.Op]
	if !ok {
		supproto.WriteError(c, fmt.Errorf("supervisor: unknown op %q: %w", req.Op, errdefs.ErrInvalid))
		return
	}
	if op != "" {
		if _, err := s.check(op); err != nil {
			supproto.WriteError(c, err)
			return
		}
	}
	switch req.Op {
	case supproto.OpStop:
		timeout := time.Duration(req.TimeoutMS) * time.Millisecond
		if timeout <= 0 {
			timeout = 30 * time.Second
		}
		s.stop(timeout)
		<-s.stopDone
		if s.stopErr != nil {
			supproto.WriteError(c, s.stopErr)
			return
		}
		supproto.WriteResult(c, supproto.Result{OK: true})
		return
	case supproto.OpDiscard:
		if err := s.handleDiscard(); err != nil {
			supproto.WriteError(c, err)
			return
		}
		supproto.WriteResult(c, supproto.Result{OK: true})
		return
	case supproto.OpSetProfile:
		s.handleSetProfile(c)
		return
	case supproto.OpCopyRefused:
		// The guest's answer to a copy out broke tarfs's rules; the
		// client that refused it says so, and the agent can read why.
		s.audit(audit.KindCopyRefused, map[string]any{"op": "copy-out", "path": req.Path, "rule": "builtin: copy out", "reason": req.Reason})
		supproto.WriteResult(c, supproto.Result{OK: true})
		return
	case supproto.OpPortAdd, supproto.OpPortRemove, supproto.OpPortList:
		s.handlePort(c, req)
		return
	case supproto.OpMountAdd, supproto.OpMountRemove:
		s.handleMount(c, req)
		return
	case supproto.OpApprovals, supproto.OpApprove:
		s.handleApprovals(c, req)
	case supproto.OpSSH:
		s.handleSSH(c)
		return
	case supproto.OpPause, supproto.OpResume, supproto.OpSuspend, supproto.OpSnapshot:
		r, err := s.control(req)
		if err != nil {
			supproto.WriteError(c, err)
			return
		}
		supproto.WriteResult(c, *r)
		return
	}
	greq, err := supproto.ToGuest(req)
	if err != nil {
		supproto.WriteError(c, err)
		return
	}
	var ex *execAudit
	if greq.Op == agentproto.OpExec {
		s.trace("exec")
		s.log.Info("exec", "args", s.execRedactor().Strings(greq.Exec.Args), "user", greq.Exec.User, "tty", greq.Exec.TTY)
		if len(s.spec.Env) > 0 {
			greq.Exec.Env = append(append([]string(nil), s.spec.Env...), greq.Exec.Env...)
		}
		ex = s.execStart(greq.Exec, req.Audit)
	}
	if active(greq, req.Audit) {
		s.act.execs.Add(1)
		defer func() { s.act.touch(); s.act.execs.Add(-1) }()
	}
	sess := s.currentSession()
	if sess == nil {
		supproto.WriteError(c, fmt.Errorf("guest agent unreachable: no session: %w", errdefs.ErrUnavailable))
		ex.end(nil, errors.New("no session"))
		return
	}
	st, err := sess.OpenStream()
	if err != nil {
		supproto.WriteError(c, fmt.Errorf("guest agent unreachable: %v: %w", err, errdefs.ErrUnavailable))
		ex.end(nil, err)
		return
	}
	defer st.Close()
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, greq); err != nil {
		ex.end(nil, err)
		return
	}
	// Relay both ways. When the guest ends the stream the answer is
	// complete; when the client goes away the stream is closed, which the
	// guest takes as "kill the process".
	done := make(chan struct{})
	go func() {
		io.Copy(st, c)
		st.Close()
		close(done)
	}()
	if ex != nil {
		// The exit frame reaches the client only after exec.end is in the
		// log: whoever learns that a command ended can read that it did.
		exit, exitFrame, err := relayExec(c, st, ex)
		s.trace("exec end")
		ex.end(exit, err)
		if exitFrame != nil {
			agentproto.WriteFrame(c, agentproto.FrameExit, exitFrame)
		}
	} else {
		io.Copy(c, st)
	}
	c.Close()
	<-done
}
