// Package sshserve is the SSH server an editor (ssh, scp, VS Code
// Remote-SSH, JetBrains Gateway) reaches a sandbox through. It runs in
// the sandbox's supervisor, on the host, over a connection the client
// opened on the supervisor's socket (`smx agent ssh-proxy`), so no port
// is opened anywhere: not on the host, not in the guest. Each channel is
// carried out by the guest agent over the control channel: a session's
// command, shell or sftp subsystem is an agentproto exec (PTY, window
// changes, signals, environment), a direct-tcpip forward an agentproto
// dial of a guest loopback port. The host key and the one accepted
// client key live in the sandbox's directory on the host and never
// enter the guest, and every session is in the audit log with its
// command, because the host sees it in clear.
package sshserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
)

// Exec is one process started in the guest: its stream carries
// agentproto exec frames after the request. End is called once with how
// it ended, for the log.
type Exec interface {
	io.ReadWriteCloser
	End(exit *agentproto.ExitStatus, err error)
}

// Config wires a Server to its sandbox.
type Config struct {
	Keys *Keys
	// Exec starts req in the guest (the supervisor logs it).
	Exec func(ctx context.Context, req *agentproto.ExecRequest) (Exec, error)
	// Dial connects to the guest's loopback TCP port.
	Dial func(ctx context.Context, port uint16) (io.ReadWriteCloser, error)
	// Log writes an audit record.
	Log    func(kind string, fields map[string]any)
	Logger *slog.Logger
	// SFTP is the guest command serving the sftp subsystem on its
	// stdin and stdout.
	SFTP []string
}

// Serve runs one SSH connection over c until it ends.
func Serve(ctx context.Context, cfg Config, c net.Conn) error {
	defer c.Close()
	want := cfg.Keys.Client.PublicKey().Marshal()
	sc := &ssh.ServerConfig{
		PublicKeyCallback: func(md ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			if bytes.Equal(key.Marshal(), want) {
				return &ssh.Permissions{Extensions: map[string]string{"fp": ssh.FingerprintSHA256(key)}}, nil
			}
			return nil, errors.New("not the sandbox's key")
		},
		AuthLogCallback: func(md ssh.ConnMetadata, method string, err error) {
			if err != nil && method == "publickey" {
				cfg.Log(audit.KindSSHLoginRefused, map[string]any{"user": md.User(), "client": string(md.ClientVersion()),
					"rule": "builtin: only the sandbox's own key (smx agent ssh-config)", "reason": err.Error()})
			}
		},
		MaxAuthTries: 3,
	}
	sc.AddHostKey(cfg.Keys.Host)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	conn, chans, reqs, err := ssh.NewServerConn(c, sc)
	if err != nil {
		return fmt.Errorf("sshserve: handshake: %w", err)
	}
	c.SetDeadline(time.Time{})
	defer conn.Close()
	cfg.Log(audit.KindSSHLogin, map[string]any{"user": conn.User(), "key": conn.Permissions.Extensions["fp"], "client": string(conn.ClientVersion())})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go ssh.DiscardRequests(reqs) // tcpip-forward (-R), keepalives: refused
	var wg sync.WaitGroup
	for nc := range chans {
		switch nc.ChannelType() {
		case "session":
			ch, creqs, err := nc.Accept()
			if err != nil {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := &session{cfg: cfg, user: conn.User(), ch: ch}
				s.serve(ctx, creqs)
			}()
		case "direct-tcpip":
			wg.Add(1)
			go func() {
				defer wg.Done()
				forward(ctx, cfg, nc)
			}()
		default:
			nc.Reject(ssh.UnknownChannelType, "smx: only sessions and forwards to guest loopback ports")
		}
	}
	cancel()
	wg.Wait()
	return nil
}

// forward serves a direct-tcpip channel (ssh -L, VS Code's tunnel to its
// server): only to a loopback port of the guest.
func forward(ctx context.Context, cfg Config, nc ssh.NewChannel) {
	var p struct {
		Host     string
		Port     uint32
		OrigHost string
		OrigPort uint32
	}
	if err := ssh.Unmarshal(nc.ExtraData(), &p); err != nil {
		nc.Reject(ssh.ConnectionFailed, "bad direct-tcpip request")
		return
	}
	fields := map[string]any{"host": p.Host, "port": p.Port}
	if !loopbackName(p.Host) || p.Port == 0 || p.Port > 65535 {
		fields["rule"] = "builtin: forwards reach only the guest's loopback"
		fields["reason"] = "not a guest loopback port"
		cfg.Log(audit.KindSSHTunnelRefused, fields)
		nc.Reject(ssh.Prohibited, "smx: forwards reach only the guest's own loopback (localhost, 127.0.0.1)")
		return
	}
	g, err := cfg.Dial(ctx, uint16(p.Port))
	if err != nil {
		fields["error"] = err.Error()
		cfg.Log(audit.KindSSHTunnel, fields)
		nc.Reject(ssh.ConnectionFailed, err.Error())
		return
	}
	defer g.Close()
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	go ssh.DiscardRequests(reqs)
	start := time.Now()
	var in, out int64
	done := make(chan struct{})
	go func() {
		in, _ = io.Copy(g, ch)
		closeWrite(g)
		close(done)
	}()
	out, _ = io.Copy(ch, g)
	ch.CloseWrite()
	<-done
	ch.Close()
	fields["bytes_in"], fields["bytes_out"], fields["duration_ms"] = in, out, time.Since(start).Milliseconds()
	cfg.Log(audit.KindSSHTunnel, fields)
}

func loopbackName(h string) bool {
	switch strings.ToLower(h) {
	case "localhost", "127.0.0.1", "::1", "[::1]":
		return true
	}
	return false
}

func closeWrite(c io.Closer) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// session is one "session" channel: at most one command, shell or
// subsystem, with the pty and environment asked for before it.
type session struct {
	cfg  Config
	user string
	ch   ssh.Channel

	env  []string
	tty  bool
	size *agentproto.WindowSize

	mu  sync.Mutex
	run Exec // once started
}

func (s *session) serve(ctx context.Context, reqs <-chan *ssh.Request) {
	defer s.ch.Close()
	started := false
	done := make(chan struct{})
	for r := range reqs {
		ok := false
		switch r.Type {
		case "env":
			var kv struct{ Name, Value string }
			if ssh.Unmarshal(r.Payload, &kv) == nil && kv.Name != "" && !strings.ContainsRune(kv.Name, '=') && !started {
				s.env = append(s.env, kv.Name+"="+kv.Value)
				ok = true
			}
		case "pty-req":
			var p struct {
				Term          string
				Cols, Rows    uint32
				Width, Height uint32
				Modes         string
			}
			if ssh.Unmarshal(r.Payload, &p) == nil && !started {
				s.tty, s.size = true, winSize(p.Cols, p.Rows)
				if p.Term != "" {
					s.env = append(s.env, "TERM="+p.Term)
				}
				ok = true
			}
		case "window-change":
			var p struct{ Cols, Rows, Width, Height uint32 }
			if ssh.Unmarshal(r.Payload, &p) == nil {
				s.send(agentproto.FrameResize, winSize(p.Cols, p.Rows))
				ok = true
			}
		case "signal":
			var p struct{ Name string }
			if ssh.Unmarshal(r.Payload, &p) == nil {
				if n, known := signals[p.Name]; known {
					s.send(agentproto.FrameSignal, agentproto.Signal{Signal: n})
					ok = true
				}
			}
		case "exec", "shell", "subsystem":
			if started {
				break
			}
			args, why := s.command(r)
			if args == nil {
				if r.WantReply {
					r.Reply(false, nil)
				}
				if why != "" {
					fmt.Fprintf(s.ch.Stderr(), "smx: %s\r\n", why)
				}
				continue
			}
			if err := s.start(ctx, args, done); err != nil {
				fmt.Fprintf(s.ch.Stderr(), "smx: %s\r\n", err)
				break
			}
			started, ok = true, true
		}
		if r.WantReply {
			r.Reply(ok, nil)
		}
	}
	if started {
		// The client closed the channel (or the connection dropped)
		// while the process may still run: closing its stream is the
		// guest's signal to kill it, as for a client of exec that goes
		// away.
		select {
		case <-done:
		default:
			s.mu.Lock()
			s.run.Close()
			s.mu.Unlock()
			<-done
		}
	}
}

// command is what the guest runs for r: `sh -c CMD` as sshd runs a
// command through a shell, a login shell, or the sftp server.
func (s *session) command(r *ssh.Request) ([]string, string) {
	switch r.Type {
	case "exec":
		var p struct{ Command string }
		if ssh.Unmarshal(r.Payload, &p) != nil {
			return nil, ""
		}
		return []string{"/bin/sh", "-c", p.Command}, ""
	case "shell":
		return []string{"/bin/sh", "-c", `if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l`}, ""
	case "subsystem":
		var p struct{ Name string }
		if ssh.Unmarshal(r.Payload, &p) != nil {
			return nil, ""
		}
		if p.Name == "sftp" && len(s.cfg.SFTP) > 0 {
			s.tty = false
			return s.cfg.SFTP, ""
		}
		return nil, fmt.Sprintf("subsystem %q is not served (use scp -O for scp's own protocol)", p.Name)
	}
	return nil, ""
}

func winSize(cols, rows uint32) *agentproto.WindowSize {
	clamp := func(v uint32) uint16 {
		if v > 0xffff {
			return 0xffff
		}
		return uint16(v)
	}
	return &agentproto.WindowSize{Rows: clamp(rows), Cols: clamp(cols)}
}

// signals maps SSH's signal names (RFC 4254 6.10) to Linux numbers.
var signals = map[string]int{"HUP": 1, "INT": 2, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12, "TERM": 15}

func (s *session) send(t agentproto.FrameType, v any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run != nil {
		agentproto.WriteJSON(s.run, t, v)
	}
}

func (s *session) start(ctx context.Context, args []string, done chan struct{}) error {
	user := s.user
	if user == "root" {
		user = ""
	}
	req := &agentproto.ExecRequest{Args: args, Env: s.env, User: user, TTY: s.tty, Size: s.size, Stdin: true}
	if !s.tty {
		req.Size = nil
	}
	run, err := s.cfg.Exec(ctx, req)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.run = run
	s.mu.Unlock()
	go func() {
		buf := make([]byte, agentproto.DataChunk)
		for {
			n, err := s.ch.Read(buf)
			if n > 0 {
				s.mu.Lock()
				werr := agentproto.WriteFrame(run, agentproto.FrameStdin, buf[:n])
				s.mu.Unlock()
				if werr != nil {
					return
				}
			}
			if err != nil {
				s.mu.Lock()
				agentproto.WriteFrame(run, agentproto.FrameStdinEOF, nil)
				s.mu.Unlock()
				return
			}
		}
	}()
	go func() {
		defer close(done)
		exit, err := s.relay(run)
		run.End(exit, err)
		run.Close()
		s.ch.CloseWrite()
		code := 255
		if exit != nil {
			code = exit.Code
		}
		if err != nil {
			fmt.Fprintf(s.ch.Stderr(), "smx: %s\r\n", err)
		}
		s.ch.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{uint32(code)}))
		s.ch.Close()
	}()
	return nil
}

// relay copies the guest's output frames to the channel until the exit.
func (s *session) relay(run io.Reader) (*agentproto.ExitStatus, error) {
	buf := make([]byte, agentproto.DataChunk+5)
	for {
		t, p, err := agentproto.ReadFrame(run, buf)
		if err != nil {
			if err == io.EOF {
				return nil, errors.New("the guest ended the session")
			}
			return nil, err
		}
		switch t {
		case agentproto.FrameStdout:
			if _, err := s.ch.Write(p); err != nil {
				return nil, err
			}
		case agentproto.FrameStderr:
			s.ch.Stderr().Write(p)
		case agentproto.FrameExit:
			var es agentproto.ExitStatus
			if err := json.Unmarshal(p, &es); err != nil {
				return nil, err
			}
			return &es, nil
		case agentproto.FrameError:
			return nil, agentproto.DecodeError(p)
		}
	}
}
