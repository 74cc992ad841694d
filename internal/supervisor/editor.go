package supervisor

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sshserve"
	"github.com/smx-dev/smx/internal/supproto"
)

// handleSSH serves supproto.OpSSH: one editor's SSH connection, ended
// here by internal/sshserve with keys from the sandbox directory, each
// channel carried out by the guest agent. An open connection counts as
// activity for --idle-stop.
func (s *Supervisor) handleSSH(c net.Conn) {
	keys, err := sshserve.Files{Dir: "."}.Load()
	if err != nil {
		supproto.WriteError(c, fmt.Errorf("the sandbox has no SSH keys yet: run `smx agent ssh-config NAME` first: %w", errdefs.ErrFailed))
		return
	}
	s.act.execs.Add(1)
	defer func() { s.act.touch(); s.act.execs.Add(-1) }()
	cfg := sshserve.Config{
		Keys:   keys,
		Exec:   s.editorExec,
		Dial:   s.editorDial,
		Log:    s.audit,
		Logger: s.log,
		SFTP:   agentproto.SFTPServerArgs,
	}
	if err := sshserve.Serve(context.Background(), cfg, c); err != nil {
		s.log.Info("ssh", "err", err)
	}
}

// guestStream opens a stream to the guest agent and sends req.
func (s *Supervisor) guestStream(req *agentproto.Request) (io.ReadWriteCloser, error) {
	sess := s.currentSession()
	if sess == nil {
		return nil, fmt.Errorf("guest agent unreachable: no session: %w", errdefs.ErrUnavailable)
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("guest agent unreachable: %v: %w", err, errdefs.ErrUnavailable)
	}
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, req); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}

type editorExec struct {
	io.ReadWriteCloser
	ex *execAudit
}

func (e *editorExec) End(exit *agentproto.ExitStatus, err error) { e.ex.end(exit, err) }

func (s *Supervisor) editorExec(ctx context.Context, req *agentproto.ExecRequest) (sshserve.Exec, error) {
	if _, err := s.check(served[supproto.OpExec]); err != nil {
		return nil, err
	}
	if len(s.spec.Env) > 0 {
		req.Env = append(append([]string(nil), s.spec.Env...), req.Env...)
	}
	s.log.Info("exec", "args", s.execRedactor().Strings(req.Args), "user", req.User, "tty", req.TTY, "via", "ssh")
	ex := s.execStart(req, "ssh")
	st, err := s.guestStream(&agentproto.Request{Op: agentproto.OpExec, Exec: req})
	if err != nil {
		ex.end(nil, err)
		return nil, err
	}
	return &editorExec{ReadWriteCloser: st, ex: ex}, nil
}

func (s *Supervisor) editorDial(ctx context.Context, port uint16) (io.ReadWriteCloser, error) {
	st, err := s.guestStream(&agentproto.Request{Op: agentproto.OpDial, Port: port})
	if err != nil {
		return nil, err
	}
	// The guest answers once connected (its own dial gives up after
	// 10 s); a guest that never answers must not hold the channel.
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	timer := time.AfterFunc(15*time.Second, func() { st.Close() })
	defer timer.Stop()
	if _, err := agentproto.ReadResult(st); err != nil {
		st.Close()
		return nil, err
	}
	return st, nil
}
