package sshgw

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/policy"
)

// guestChannel handles one channel the guest opens.
func (c *conn) guestChannel(ctx context.Context, nc ssh.NewChannel) {
	switch nc.ChannelType() {
	case "session":
		c.session(ctx, nc)
	case "direct-tcpip":
		var p struct {
			Host     string
			Port     uint32
			OrigHost string
			OrigPort uint32
		}
		if err := ssh.Unmarshal(nc.ExtraData(), &p); err != nil {
			msg := c.refuseReq("direct-tcpip", false, nil, "malformed direct-tcpip request over "+c.what())
			nc.Reject(ssh.ConnectionFailed, msg)
			return
		}
		dest := net.JoinHostPort(p.Host, strconv.Itoa(int(p.Port)))
		if !c.rule.Forwards(policy.ForwardLocal) {
			msg := c.refuseReq("direct-tcpip", true, map[string]any{"forward_to": dest},
				"port forwarding (-L, -D, -J) to "+dest+" over "+c.what()+" is not allowed; the rule needs forward: [local]")
			nc.Reject(ssh.Prohibited, msg)
			return
		}
		// The destination is one the guest names, reached from the upstream
		// host: the profile's network rules decide it, as for a connection
		// from the sandbox, with the gateway's current profile.
		d := decideForward(c.g.prof.Load(), p.Host, p.Port)
		if !d.Allow {
			msg := c.g.refuse(c.t, c.user, "direct-tcpip", policy.Decision{Rule: d.Rule, Reason: "port forwarding over " + c.what() + ": " + d.Reason},
				map[string]any{"forward_to": dest})
			nc.Reject(ssh.Prohibited, msg)
			return
		}
		c.forward(nc, c.up, "direct-tcpip", dest, &liveForward{host: p.Host, port: p.Port}, d.Rule)
	default:
		msg := c.refuseReq(nc.ChannelType(), false, nil, "channel type "+strconv.Quote(nc.ChannelType())+" over "+c.what()+" is not supported by the gateway")
		nc.Reject(ssh.UnknownChannelType, msg)
	}
}

// guestGlobal handles the guest's global requests: -R (tcpip-forward) only
// when the rule allows remote forwarding.
func (c *conn) guestGlobal(reqs <-chan *ssh.Request) {
	for r := range reqs {
		switch r.Type {
		case "tcpip-forward", "cancel-tcpip-forward":
			if !c.rule.Forwards(policy.ForwardRemote) {
				var p struct {
					Addr string
					Port uint32
				}
				ssh.Unmarshal(r.Payload, &p)
				if r.Type == "tcpip-forward" {
					c.refuseReq(r.Type, true, map[string]any{"listen": net.JoinHostPort(p.Addr, strconv.Itoa(int(p.Port)))},
						"remote port forwarding (-R) over "+c.what()+" is not allowed; the rule needs forward: [remote]")
				}
				r.Reply(false, nil)
				continue
			}
			ok, payload, err := c.up.SendRequest(r.Type, r.WantReply, r.Payload)
			r.Reply(ok && err == nil, payload)
		default:
			// keepalive@openssh.com, no-more-sessions@openssh.com, ...
			r.Reply(false, nil)
		}
	}
}

// upstreamChannels passes channels the upstream opens (-R connections,
// agent and X11 requests) to the guest, only for kinds the rule allows.
func (c *conn) upstreamChannels() {
	for nc := range c.upChans {
		kind := ""
		switch nc.ChannelType() {
		case "forwarded-tcpip":
			kind = policy.ForwardRemote
		case "auth-agent@openssh.com":
			kind = policy.ForwardAgent
		case "x11":
			kind = policy.ForwardX11
		}
		if kind == "" || !c.rule.Forwards(kind) {
			c.refuseReq("upstream "+nc.ChannelType(), kind != "", nil, "upstream channel "+nc.ChannelType()+" over "+c.what()+" is not allowed")
			nc.Reject(ssh.Prohibited, "refused by the smx gateway")
			continue
		}
		go c.forward(nc, c.gconn, nc.ChannelType(), "", nil, "")
	}
}

// what names the connection in messages: user@host port N.
func (c *conn) what() string {
	return "ssh to " + c.user + "@" + c.t.name() + " port " + portStr(c.t.Addr.Port())
}

// refuseReq logs a refused request and returns the line for the guest.
// supported says whether the gateway knows the request (then the rule
// that allowed the login is what lacks it) or not (RuleRequest).
func (c *conn) refuseReq(request string, supported bool, extra map[string]any, reason string) string {
	rule := c.ruleID
	if !supported {
		rule = RuleRequest
	}
	return c.g.refuse(c.t, c.user, request, policy.Decision{Rule: rule, Reason: reason}, extra)
}

// forward opens the same channel on the other side (to, the upstream or
// the guest connection) and copies until both ends close. It writes an
// ssh.forward record (with netRule, the network rule that allowed dest).
// A non-nil lf is kept while the channel is open, so that a profile change
// can close it.
func (c *conn) forward(nc ssh.NewChannel, to ssh.Conn, typ, dest string, lf *liveForward, netRule string) {
	start := time.Now()
	och, oreqs, err := to.OpenChannel(typ, nc.ExtraData())
	if err != nil {
		if oe, ok := err.(*ssh.OpenChannelError); ok {
			nc.Reject(oe.Reason, oe.Message)
		} else {
			nc.Reject(ssh.ConnectionFailed, err.Error())
		}
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		och.Close()
		return
	}
	go ssh.DiscardRequests(reqs)
	go ssh.DiscardRequests(oreqs)
	if lf != nil {
		lf.close = func() { ch.Close(); och.Close() }
		c.addForward(lf)
		defer c.removeForward(lf)
	}
	var a, b int64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a, _ = io.Copy(och, ch); och.CloseWrite() }()
	go func() { defer wg.Done(); b, _ = io.Copy(ch, och); ch.CloseWrite() }()
	wg.Wait()
	ch.Close()
	och.Close()
	f := c.baseFields()
	f["channel"] = typ
	if dest != "" {
		f["forward_to"] = dest
	}
	if netRule != "" {
		f["forward_rule"] = netRule
	}
	f["bytes_a_to_b"], f["bytes_b_to_a"] = a, b
	f["duration_ms"] = time.Since(start).Milliseconds()
	c.g.cfg.Log(KindForward, f)
}

func (c *conn) baseFields() map[string]any {
	f := map[string]any{"host": c.t.name(), "dst": c.t.Addr.String(), "port": int(c.t.Addr.Port()),
		"user": c.user, "rule": c.ruleID}
	for k, v := range c.auth {
		f[k] = v
	}
	return f
}

// session proxies one session channel, request by request.
func (c *conn) session(ctx context.Context, nc ssh.NewChannel) {
	start := time.Now()
	uch, ureqs, err := c.up.OpenChannel("session", nil)
	if err != nil {
		nc.Reject(ssh.ConnectionFailed, "smx: upstream session: "+err.Error())
		return
	}
	gch, greqs, err := nc.Accept()
	if err != nil {
		uch.Close()
		return
	}
	s := &session{c: c, g: gch, u: uch, start: start, outDone: make(chan struct{})}
	c.addSession(s)
	defer c.removeSession(s)
	var wg sync.WaitGroup
	s.wg = &wg
	wg.Add(1)
	outDone := s.outDone
	go func() { // upstream requests (exit-status, exit-signal) → guest
		defer wg.Done()
		for r := range ureqs {
			switch r.Type {
			case "exit-status":
				if len(r.Payload) >= 4 {
					st := binary.BigEndian.Uint32(r.Payload)
					s.exitStatus.Store(int64(st) + 1)
				}
				<-outDone // the output first, as sshd sends it
				gch.SendRequest(r.Type, false, r.Payload)
			case "exit-signal":
				var p struct {
					Signal     string
					CoreDumped bool
					Msg, Lang  string
				}
				if ssh.Unmarshal(r.Payload, &p) == nil {
					s.setSignal(p.Signal)
				}
				<-outDone
				gch.SendRequest(r.Type, false, r.Payload)
			default:
				if r.WantReply {
					r.Reply(false, nil)
				}
			}
		}
		<-outDone
		gch.CloseWrite()
		gch.Close()
	}()
	s.requests(ctx, greqs)
	s.startIO(ctx, nil, nil)
	uch.Close()
	wg.Wait()
	gch.Close()
	s.record()
}

type session struct {
	c     *conn
	g, u  ssh.Channel
	start time.Time

	wg      *sync.WaitGroup
	ioOnce  sync.Once
	outDone chan struct{} // closed when the upstream's output has been copied
	fetch   *fetchTap     // an allowed git-upload-pack: what the guest asked for, for git.fetch

	mu         sync.Mutex
	what       []string // commands, "shell", "subsystem sftp"
	pty        bool
	envPassed  []string
	envRefused []string
	signal     string
	refused    bool

	out, in    atomic.Int64
	exitStatus atomic.Int64 // status+1; 0 when none came
}

func (s *session) setSignal(sig string) { s.mu.Lock(); s.signal = sig; s.mu.Unlock() }

func (s *session) add(what string) { s.mu.Lock(); s.what = append(s.what, what); s.mu.Unlock() }

// requests filters the guest's session requests until the guest closes
// the channel.
func (s *session) requests(ctx context.Context, reqs <-chan *ssh.Request) {
	c := s.c
	for r := range reqs {
		switch r.Type {
		case "pty-req":
			s.mu.Lock()
			s.pty = true
			s.mu.Unlock()
			s.pass(r)
		case "window-change", "signal", "break":
			s.pass(r)
		case "shell":
			s.add("shell")
			s.startIO(ctx, nil, nil)
			s.pass(r)
		case "env":
			var p struct{ Name, Value string }
			if ssh.Unmarshal(r.Payload, &p) != nil {
				r.Reply(false, nil)
				continue
			}
			s.mu.Lock()
			ok := envAllowed(c.rule.Env, p.Name)
			if ok {
				s.envPassed = append(s.envPassed, p.Name)
			} else {
				s.envRefused = append(s.envRefused, p.Name)
			}
			s.mu.Unlock()
			if ok {
				s.pass(r)
			} else {
				r.Reply(false, nil)
			}
		case "exec":
			var p struct{ Command string }
			if ssh.Unmarshal(r.Payload, &p) != nil {
				r.Reply(false, nil)
				continue
			}
			s.exec(ctx, r, p.Command)
		case "subsystem":
			var p struct{ Name string }
			ssh.Unmarshal(r.Payload, &p)
			s.add("subsystem " + p.Name)
			if p.Name != "sftp" || c.rule.SFTP != policy.Allow {
				reason := "the " + p.Name + " subsystem (sftp, scp) over " + c.what() + " is not allowed; the rule needs sftp: allow"
				if p.Name != "sftp" {
					reason = "subsystem " + strconv.Quote(p.Name) + " over " + c.what() + " is not supported by the gateway"
				}
				s.deny(r, "subsystem "+p.Name, reason, nil)
				continue
			}
			s.startIO(ctx, nil, nil)
			s.pass(r)
		case "x11-req":
			s.forwardReq(r, policy.ForwardX11, "X11 forwarding (-X, -Y)")
		case "auth-agent-req@openssh.com":
			s.forwardReq(r, policy.ForwardAgent, "agent forwarding (-A)")
		default:
			c.refuseReq(r.Type, false, nil, "session request "+strconv.Quote(r.Type)+" over "+c.what()+" is not supported by the gateway")
			if r.WantReply {
				r.Reply(false, nil)
			}
		}
	}
}

// pass sends r upstream and its answer back.
func (s *session) pass(r *ssh.Request) {
	ok, err := s.u.SendRequest(r.Type, r.WantReply, r.Payload)
	if r.WantReply {
		r.Reply(ok && err == nil, nil)
	}
}

// deny refuses a request that would start something (exec, subsystem).
// The request succeeds as far as the guest's client can tell, then the
// reason arrives on its stderr and the command ends with status 1 (a
// failed request makes OpenSSH's client exit before it prints what the
// server wrote, so the agent would not learn why).
func (s *session) deny(r *ssh.Request, request, reason string, extra map[string]any) {
	if extra == nil {
		extra = map[string]any{}
	}
	msg := s.c.g.refuse(s.c.t, s.c.user, request, policy.Decision{Rule: s.c.ruleID, Reason: reason}, extra)
	s.fail(r, msg)
}

// fail ends the session with msg on the guest's stderr and exit status 1.
func (s *session) fail(r *ssh.Request, msg string) {
	s.startIO(context.Background(), nil, nil)
	s.mu.Lock()
	s.refused = true
	s.mu.Unlock()
	if r.WantReply {
		r.Reply(true, nil)
	}
	io.WriteString(s.g.Stderr(), msg+"\r\n")
	s.exitStatus.Store(2)
	s.g.SendRequest("exit-status", false, ssh.Marshal(struct{ Status uint32 }{1}))
	s.u.Close() // ends the session: the upstream side closes the guest's channel
}

func (s *session) forwardReq(r *ssh.Request, kind, what string) {
	if !s.c.rule.Forwards(kind) {
		s.c.refuseReq(r.Type, true, nil, what+" over "+s.c.what()+" is not allowed; the rule needs forward: ["+kind+"]")
		if r.WantReply {
			r.Reply(false, nil)
		}
		return
	}
	s.pass(r)
}

// exec filters an exec request: scp needs sftp: allow, Git's services
// are decided by the GitGate; anything else runs.
func (s *session) exec(ctx context.Context, r *ssh.Request, cmd string) {
	c := s.c
	s.add(quoteCmd(cmd))
	if isSCP(cmd) && c.rule.SFTP != policy.Allow {
		s.deny(r, "exec", "scp over "+c.what()+" is not allowed; the rule needs sftp: allow", map[string]any{"command": quoteCmd(cmd)})
		return
	}
	svc, repoPath, isGit := ParseGitCommand(cmd)
	if !isGit && mentionsGitService(cmd) {
		// Not exactly a Git service request, yet naming one: refuse rather
		// than let `git-receive-pack 'x'; true` run past the git rules.
		s.deny(r, "exec", "command "+strconv.Quote(quoteCmd(cmd))+" names a Git service but is not a plain Git request; use git clone/fetch/push",
			map[string]any{"command": quoteCmd(cmd)})
		return
	}
	var tap *fetchTap
	if isGit {
		gr, bad := c.gitRequest(svc, repoPath)
		var d policy.Decision
		if bad != "" {
			d = policy.Decision{Rule: "builtin: malformed request", Reason: bad}
		} else {
			d = c.g.cfg.Git.Decide(gr)
		}
		if !d.Allow {
			s.fail(r, c.g.refuse(c.t, c.user, "exec "+svc, d, map[string]any{"command": quoteCmd(cmd), "repo": gr.Repo}))
			return
		}
		if svc == "git-upload-pack" {
			tap = c.fetchTap(gr, d.Rule)
		}
		if gr.Push() {
			sp, msg := c.pushFilter(gr)
			if sp == nil {
				s.fail(r, c.g.refuse(c.t, c.user, "exec "+svc, policy.Decision{Rule: "builtin: malformed request", Reason: msg},
					map[string]any{"command": quoteCmd(cmd), "repo": gr.Repo}))
				return
			}
			if !s.startIO(ctx, sp, nil) {
				// The stream already runs unfiltered (a shell or another
				// command on this channel): a push cannot join it.
				s.deny(r, "exec "+svc, "a Git push must be the first command of its SSH session", map[string]any{"command": quoteCmd(cmd), "repo": gr.Repo})
				return
			}
		}
	}
	s.startIO(ctx, nil, tap)
	s.pass(r)
}

// startIO starts copying the session's streams, once: as they are, or,
// for a push, through the Git gateway's push filter; tap (a fetch's) sees
// what the guest sends. It reports whether the streams run the way asked.
func (s *session) startIO(ctx context.Context, push *gitgw.StreamPush, tap *fetchTap) bool {
	started := false
	s.ioOnce.Do(func() {
		started = true
		s.fetch = tap
		gch, uch := s.g, s.u
		s.wg.Add(2)
		var ow sync.WaitGroup
		ow.Add(2)
		go func() { // upstream stderr → guest
			defer s.wg.Done()
			defer ow.Done()
			n, _ := io.Copy(gch.Stderr(), uch.Stderr())
			s.in.Add(n)
		}()
		go func() { ow.Wait(); close(s.outDone) }()
		if push == nil {
			go func() { // guest stdin → upstream
				defer s.wg.Done()
				var src io.Reader = gch
				if s.fetch != nil {
					src = io.TeeReader(gch, s.fetch)
				}
				n, _ := io.Copy(uch, src)
				s.out.Add(n)
				uch.CloseWrite()
			}()
			go func() { // upstream stdout → guest
				defer ow.Done()
				n, _ := io.Copy(gch, uch)
				s.in.Add(n)
			}()
			return
		}
		go func() {
			defer s.wg.Done()
			defer ow.Done()
			in := &countReader{r: gch, n: &s.out}
			out := &countWriter{w: gch, n: &s.in}
			if err := push.Run(ctx, in, out, closeWriter{uch}, uch); err != nil {
				io.WriteString(gch.Stderr(), oneLine(err.Error())+"\r\n")
				uch.Close()
			}
			io.Copy(out, uch)
		}()
	})
	return started || push == nil
}

// record writes the session's ssh.session record.
func (s *session) record() {
	f := s.c.baseFields()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.what) == 0 {
		f["command"] = ""
	} else {
		f["command"] = strings.Join(s.what, "; ")
	}
	f["pty"] = s.pty
	if len(s.envPassed) > 0 {
		f["env"] = strings.Join(s.envPassed, ",")
	}
	if len(s.envRefused) > 0 {
		f["env_refused"] = strings.Join(s.envRefused, ",")
	}
	if st := s.exitStatus.Load(); st > 0 {
		f["exit_status"] = st - 1
	}
	if s.signal != "" {
		f["exit_signal"] = s.signal
	}
	if s.refused {
		f["refused"] = true
	}
	f["bytes_out"] = s.out.Load()
	f["bytes_in"] = s.in.Load()
	f["duration_ms"] = time.Since(s.start).Milliseconds()
	s.c.g.cfg.Log(KindSession, f)
	if s.fetch != nil && !s.refused {
		s.fetch.record(s.c, s.in.Load())
	}
}

// envAllowed reports whether an env request for name may pass: names
// matching one of globs (nil means policy.DefaultSSHEnv).
func envAllowed(globs []string, name string) bool {
	if globs == nil {
		globs = policy.DefaultSSHEnv
	}
	for _, g := range globs {
		if ok, _ := path.Match(g, name); ok {
			return true
		}
	}
	return false
}

// mentionsGitService reports whether cmd names one of Git's services.
func mentionsGitService(cmd string) bool {
	for _, svc := range []string{"upload-pack", "receive-pack", "upload-archive"} {
		if strings.Contains(cmd, svc) {
			return true
		}
	}
	return false
}

// isSCP reports whether cmd is the remote end of a legacy-mode scp
// ("scp -t ..." to upload, "scp -f ..." to download).
func isSCP(cmd string) bool {
	f := strings.Fields(cmd)
	if len(f) == 0 || (f[0] != "scp" && !strings.HasSuffix(f[0], "/scp")) {
		return false
	}
	for _, a := range f[1:] {
		if strings.HasPrefix(a, "-") && strings.ContainsAny(a, "tf") && !strings.HasPrefix(a, "--") {
			return true
		}
	}
	return false
}
