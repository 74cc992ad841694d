package sshgw

import (
	"io"
	"net"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/policy"
)

// A live connection is held to what allowed it, not only to what allowed
// it when it opened:
//
//   - A certificate login ends when its certificate does: the upstream
//     checks a certificate only at login, so without this a session would
//     outlive ssh.cert_ttl by as long as the guest kept it open.
//   - A profile change (smx agent policy) decides every live connection
//     again: one whose user the new profile refuses, or whose rule, host
//     credential or git section (what its requests are decided by) the new
//     profile changes, is closed; the guest reconnects under the new
//     profile. A forwarded connection (-L, -D, -W) whose destination the
//     new network rules refuse is closed.
//
// Each closing is an ssh.refused record naming the rule and why, and the
// reason goes to the stderr of the connection's open sessions first.

// Rules a live connection is ended by.
const (
	RuleCertExpired = "sshgw: certificate expired"
	RuleProfile     = "sshgw: profile changed"
)

// liveState is what a connection keeps to be decided again while it lives.
type liveState struct {
	mu        sync.Mutex
	committed bool // the login is made (user, rule, up are set)
	ended     bool
	sessions  map[*session]struct{}
	forwards  map[*liveForward]struct{}
}

// liveForward is one open direct-tcpip channel.
type liveForward struct {
	host  string
	port  uint32
	close func()
}

func (c *conn) addSession(s *session) {
	c.live.mu.Lock()
	defer c.live.mu.Unlock()
	if c.live.sessions == nil {
		c.live.sessions = map[*session]struct{}{}
	}
	c.live.sessions[s] = struct{}{}
}

func (c *conn) removeSession(s *session) {
	c.live.mu.Lock()
	delete(c.live.sessions, s)
	c.live.mu.Unlock()
}

func (c *conn) addForward(f *liveForward) {
	c.live.mu.Lock()
	defer c.live.mu.Unlock()
	if c.live.forwards == nil {
		c.live.forwards = map[*liveForward]struct{}{}
	}
	c.live.forwards[f] = struct{}{}
}

func (c *conn) removeForward(f *liveForward) {
	c.live.mu.Lock()
	delete(c.live.forwards, f)
	c.live.mu.Unlock()
}

// committed marks the login made and, if the gateway's profile changed
// since the connection opened, decides the connection again (SetProfile
// skips connections still logging in).
func (c *conn) markCommitted() {
	c.live.mu.Lock()
	c.live.committed = true
	c.live.mu.Unlock()
	if p := c.g.prof.Load(); p != c.prof {
		c.recheck(p)
	}
}

// end closes the connection for d (a record, and the reason on the
// stderr of its open sessions). Only the first call does anything.
func (c *conn) end(request string, d policy.Decision) {
	c.live.mu.Lock()
	if c.live.ended {
		c.live.mu.Unlock()
		return
	}
	c.live.ended = true
	var ss []*session
	for s := range c.live.sessions {
		ss = append(ss, s)
	}
	c.live.mu.Unlock()
	msg := c.g.refuse(c.t, c.user, request, d, nil)
	var wg sync.WaitGroup
	for _, s := range ss {
		wg.Add(1)
		go func() { defer wg.Done(); io.WriteString(s.g.Stderr(), "\r\n"+msg+"\r\n") }()
	}
	waitTimeout(&wg, 2*time.Second) // a guest that reads nothing does not hold the close up
	c.close()
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// expireAt ends the connection when its upstream certificate expires.
// The returned func stops the timer.
func (c *conn) expireAt(t time.Time, ttl time.Duration) func() bool {
	tm := time.AfterFunc(time.Until(t), func() {
		c.end("certificate expiry", policy.Decision{Rule: RuleCertExpired, Reason: "the gateway's certificate for " + c.what() +
			" expired (ssh.cert_ttl " + ttl.String() + "); the connection was closed. Reconnect for a new certificate, or raise ssh.cert_ttl in the profile for longer sessions"})
	})
	return tm.Stop
}

// recheck decides a logged-in connection again under p and ends it, or
// the forwards p no longer allows.
func (c *conn) recheck(p *policy.Profile) {
	c.live.mu.Lock()
	if !c.live.committed || c.live.ended || c.up == nil || c.t.Refusal != nil {
		c.live.mu.Unlock()
		return
	}
	c.live.mu.Unlock()
	if p == nil {
		c.end("profile change", policy.Decision{Rule: RuleProfile, Reason: "the sandbox's profile was removed; the connection to " + c.what() + " was closed"})
		return
	}
	if c.prof != nil && p.Hash == c.prof.Hash {
		return
	}
	req := c.sshRequest(c.user)
	d, rule := p.DecideSSH(req)
	if d.Ask {
		d.Allow = true // the host user answered for this connection
	}
	if !d.Allow {
		c.end("profile change", policy.Decision{Rule: d.Rule, Reason: "the sandbox's profile changed and no longer allows " + c.what() +
			": " + d.Reason + "; the connection was closed"})
		return
	}
	if what := changedFor(c.prof, p, c.rule, rule, req); what != "" {
		c.end("profile change", policy.Decision{Rule: RuleProfile, Reason: "the sandbox's profile changed " + what + " that " + c.what() +
			" was opened under; the connection was closed: reconnect to continue under the new profile (" + d.Rule + ")"})
		return
	}
	c.live.mu.Lock()
	var fs []*liveForward
	for f := range c.live.forwards {
		fs = append(fs, f)
	}
	c.live.mu.Unlock()
	for _, f := range fs {
		if fd := decideForward(p, f.host, f.port); !fd.Allow {
			c.g.refuse(c.t, c.user, "direct-tcpip", policy.Decision{Rule: fd.Rule, Reason: "the sandbox's profile changed: " + fd.Reason +
				"; the forwarded connection was closed"}, map[string]any{"forward_to": net.JoinHostPort(f.host, strconv.Itoa(int(f.port)))})
			f.close()
		}
	}
}

// changedFor says what of old a connection allowed by oldRule for req
// depends on that p (allowing it by newRule) changes: the ssh rule's
// grants, the host credential, the git section; "" when none.
func changedFor(old, p *policy.Profile, oldRule, newRule policy.SSHRule, req policy.Request) string {
	if old == nil {
		return "the rules"
	}
	strip := func(r policy.SSHRule) policy.SSHRule { r.Pos, r.Where = policy.Pos{}, ""; return r }
	if !reflect.DeepEqual(strip(oldRule), strip(newRule)) {
		return "the ssh rule"
	}
	oc, ook := old.CredentialFor(req)
	nc, nok := p.CredentialFor(req)
	if ook != nok || oc.Name != nc.Name || oc.From != nc.From {
		return "the host credential"
	}
	if !reflect.DeepEqual(gitRules(old.Git), gitRules(p.Git)) {
		return "the git rules"
	}
	return ""
}

// gitRules is g without where its rules were written.
func gitRules(g policy.Git) []policy.RepoRule {
	out := make([]policy.RepoRule, len(g.Repos))
	for i, r := range g.Repos {
		r.Pos, r.Where = policy.Pos{}, ""
		refs := make([]policy.RefRule, len(r.Refs))
		for j, rr := range r.Refs {
			rr.Pos, rr.Where = policy.Pos{}, ""
			refs[j] = rr
		}
		r.Refs = refs
		out[i] = r
	}
	return out
}

// decideForward decides a direct-tcpip destination as the network gateway
// decides a connection from the guest (policy.Profile.Decide): the same
// rules, and always-closed addresses and names (metadata, link-local,
// loopback, localhost) stay closed. A name is decided by name; the
// upstream host resolves it.
func decideForward(p *policy.Profile, host string, port uint32) policy.Decision {
	dest := net.JoinHostPort(host, strconv.Itoa(int(port)))
	if port == 0 || port > 65535 {
		return policy.Decision{Rule: "builtin: malformed request", Reason: "forward destination " + strconv.Quote(dest) + ": port out of range"}
	}
	if p == nil {
		return policy.Decision{Rule: "sshgw: no policy", Reason: "the sandbox has no profile"}
	}
	d := p.Decide(policy.Request{Kind: policy.KindNet, Proto: "tcp", Host: host, Port: uint16(port)})
	d.Reason = "forward to " + dest + " is decided by the network rules: " + d.Reason
	return d
}
