package sshgw

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/smx-dev/smx/internal/policy"
)

// conn is one guest connection and, once the guest's user is allowed, its
// upstream connection.
type conn struct {
	g     *Gateway
	t     Target
	guest net.Conn
	prof  *policy.Profile
	start time.Time

	// Set once by commit, during the guest's first authentication
	// request (the banner callback), before any channel exists.
	user    string
	rule    policy.SSHRule
	ruleID  string // the decision's rule label
	refusal string // the line shown to the guest when it may not log in
	up      ssh.Conn
	upChans <-chan ssh.NewChannel
	upReqs  <-chan *ssh.Request
	auth    map[string]any // how the gateway logged in upstream, for records

	expires time.Time     // when the upstream certificate expires; zero for a host-held key
	ttl     time.Duration // its lifetime, for the record

	gconn     *ssh.ServerConn
	closeOnce sync.Once
	live      liveState
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		c.guest.Close()
		if c.up != nil {
			c.up.Close()
		}
	})
}

func (c *conn) serve(ctx context.Context) {
	names := []string{c.t.Addr.Addr().String()}
	if c.t.Host != "" {
		names = append([]string{c.t.Host}, names...)
	}
	hostSigner, err := c.g.cfg.HostCA.hostCert(c.g.hostKey, names, time.Now())
	if err != nil {
		c.g.log.Warn("sshgw: host certificate", "err", err)
		return
	}
	// When the rule that routed this connection names exactly one user,
	// log in upstream as that user now, while the guest (slow under TCG)
	// does its key exchange; a guest asking for another user gets a login
	// of its own and the speculative one is closed unused.
	var spec chan *login
	consumed := false
	if c.prof != nil && c.t.Refusal == nil {
		// Not when the login would be asked about: the question waits for
		// the user the guest names.
		if hint := c.prof.SSHUserHint(c.t.Host, c.t.Addr.Addr(), c.t.Addr.Port()); hint != "" && !c.prof.Decide(c.sshRequest(hint)).Ask {
			spec = make(chan *login, 1)
			go func() { spec <- c.login(ctx, hint) }()
		}
	}
	defer func() {
		if spec != nil && !consumed {
			go func() { discard(<-spec) }()
		}
	}()
	var once sync.Once
	cfg := &ssh.ServerConfig{
		ServerVersion: "SSH-2.0-smx-gateway",
		NoClientAuth:  true,
		BannerCallback: func(m ssh.ConnMetadata) string {
			once.Do(func() {
				if spec != nil {
					consumed = true
					l := <-spec
					if l.user == m.User() {
						c.commit(l)
						return
					}
					discard(l)
				}
				c.commit(c.login(ctx, m.User()))
			})
			if c.refusal != "" {
				return c.refusal + "\r\n"
			}
			return ""
		},
		NoClientAuthCallback: func(m ssh.ConnMetadata) (*ssh.Permissions, error) { return c.authorize(m) },
		// The guest may offer any key: none is worth anything here.
		PublicKeyCallback: func(m ssh.ConnMetadata, _ ssh.PublicKey) (*ssh.Permissions, error) { return c.authorize(m) },
		MaxAuthTries:      6,
	}
	// AES-GCM only towards the guest: OpenSSH clients prefer
	// chacha20-poly1305 when offered, and under TCG the guest's AES-GCM
	// (emulated AES-NI and PCLMUL) moves about 1.4 times as many bytes per
	// second; every OpenSSH since 6.2 speaks it. The upstream leg runs on
	// the host and negotiates as usual.
	cfg.Ciphers = []string{"aes128-gcm@openssh.com", "aes256-gcm@openssh.com"}
	cfg.AddHostKey(hostSigner)
	sc, chans, reqs, err := ssh.NewServerConn(c.guest, cfg)
	if err != nil {
		c.g.log.Debug("sshgw: guest handshake", "target", c.t.name(), "err", err)
		return
	}
	c.gconn = sc
	if !c.expires.IsZero() {
		stop := c.expireAt(c.expires, c.ttl)
		defer stop()
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); c.guestGlobal(reqs) }()
	go func() { defer wg.Done(); c.upstreamChannels() }()
	go func() { defer wg.Done(); ssh.DiscardRequests(c.upReqs) }()
	go func() {
		// Either side ending ends both.
		c.up.Wait()
		c.close()
	}()
	var chWG sync.WaitGroup
	for nc := range chans {
		chWG.Add(1)
		go func() { defer chWG.Done(); c.guestChannel(ctx, nc) }()
	}
	c.close()
	chWG.Wait()
	wg.Wait()
}

// discard closes a login nobody will use.
func discard(l *login) {
	if l.up != nil {
		l.up.Close()
	}
}

// authorize lets the guest in once commit has made an upstream login for
// the same user.
func (c *conn) authorize(m ssh.ConnMetadata) (*ssh.Permissions, error) {
	if c.up == nil || m.User() != c.user {
		return nil, errors.New("refused")
	}
	return &ssh.Permissions{}, nil
}

// login is the outcome of deciding a user and logging in upstream as
// them: a refusal, or an upstream connection.
type login struct {
	user    string
	rule    policy.SSHRule
	ruleID  string
	refusal *policy.Decision
	extra   map[string]any // fields for the refusal record
	up      ssh.Conn
	chans   <-chan ssh.NewChannel
	reqs    <-chan *ssh.Request
	auth    map[string]any // how the gateway logged in, for records
	expires time.Time      // the certificate's expiry; zero for a host-held key
	ttl     time.Duration
}

// commit makes l this connection's login; a refusal is logged and shown
// to the guest.
func (c *conn) commit(l *login) {
	c.user = l.user
	if l.refusal != nil {
		c.refusal = c.g.refuse(c.t, l.user, "connect", *l.refusal, l.extra)
		return
	}
	c.rule, c.ruleID = l.rule, l.ruleID
	c.up, c.upChans, c.upReqs, c.auth = l.up, l.chans, l.reqs, l.auth
	c.expires, c.ttl = l.expires, l.ttl
	c.markCommitted()
}

// sshRequest is the policy request for logging in as user on this
// connection's target.
func (c *conn) sshRequest(user string) policy.Request {
	req := policy.Request{Kind: policy.KindSSH, Host: c.t.Host, IP: c.t.Addr.Addr(), Port: c.t.Addr.Port(), User: user}
	if c.t.Host == "" {
		req.Host = c.t.Addr.Addr().String()
	}
	return req
}

// login decides user and, if allowed, logs in upstream. It logs nothing:
// the caller commits the result, or discards a speculative one.
func (c *conn) login(ctx context.Context, user string) *login {
	l := &login{user: user}
	fail := func(d policy.Decision, extra map[string]any) *login {
		l.refusal, l.extra = &d, extra
		return l
	}
	req := c.sshRequest(user)
	if c.prof == nil {
		return fail(policy.Decision{Rule: "sshgw: no policy", Reason: "the sandbox has no profile"}, nil)
	}
	d, rule := c.prof.DecideSSH(req)
	if d.Ask && c.t.Refusal == nil && c.g.cfg.Ask != nil {
		// Held in the handshake (the guest's client waits for the
		// banner) until the host user answers.
		what := "ssh " + user + "@" + c.t.name() + " port " + portStr(c.t.Addr.Port())
		ok, reason := c.g.cfg.Ask(ctx, req, d, what)
		if !ok {
			return fail(policy.Decision{Rule: d.Rule, Reason: what + " was asked of the host user: " + reason}, nil)
		}
		d.Allow, d.Ask = true, false
	}
	if !d.Allow {
		return fail(d, nil)
	}
	if c.t.Refusal != nil {
		// The network gateway refused the flow; say so, never dial.
		return fail(*c.t.Refusal, nil)
	}
	l.rule, l.ruleID = rule, d.Rule
	hostport := net.JoinHostPort(c.t.name(), portStr(c.t.Addr.Port()))

	var agentConn net.Conn // the host ssh-agent, during login only
	defer func() {
		if agentConn != nil {
			agentConn.Close()
		}
	}()
	auth, authRec, expires, err := c.authMethod(req, rule, user, &agentConn)
	if err != nil {
		return fail(policy.Decision{Rule: RuleCredential, Reason: err.Error()}, nil)
	}
	hkcb, algos, refusal := c.hostKeyCheck(hostport, rule, d.Rule)
	if refusal != nil {
		return fail(*refusal, nil)
	}
	var hostKeyErr *policy.Decision
	var offered string
	cb := func(host string, remote net.Addr, key ssh.PublicKey) error {
		offered = ssh.FingerprintSHA256(key)
		if d := hkcb(host, remote, key); d != nil {
			hostKeyErr = d
			return errors.New(d.Reason)
		}
		return nil
	}
	dctx, cancel := context.WithTimeout(ctx, c.g.cfg.Timeout)
	defer cancel()
	nc, err := c.g.cfg.Dial(dctx, "tcp", c.t.Addr.String())
	if err != nil {
		return fail(policy.Decision{Rule: RuleUpstream, Reason: "cannot reach " + hostport + ": " + err.Error()}, nil)
	}
	stop := context.AfterFunc(dctx, func() { nc.Close() })
	up, chans, reqs, err := ssh.NewClientConn(nc, hostport, &ssh.ClientConfig{
		User:              user,
		Auth:              []ssh.AuthMethod{auth},
		HostKeyCallback:   cb,
		HostKeyAlgorithms: algos,
		ClientVersion:     "SSH-2.0-smx-gateway",
	})
	if !stop() || err != nil {
		nc.Close()
		switch {
		case hostKeyErr != nil:
			return fail(*hostKeyErr, map[string]any{"host_key": offered})
		case err == nil:
			up.Close()
			return fail(policy.Decision{Rule: RuleUpstream, Reason: "login to " + hostport + " timed out"}, nil)
		default:
			reason := "login to " + user + "@" + hostport + " failed: " + err.Error()
			if strings.Contains(err.Error(), "unable to authenticate") {
				reason = user + "@" + hostport + " did not accept the gateway's " + fmt.Sprint(authRec["auth"]) +
					"; install the smx user CA there (smx ssh-ca show) or bind an ssh_host credential"
			}
			return fail(policy.Decision{Rule: RuleUpstream, Reason: reason}, authRec)
		}
	}
	l.up, l.chans, l.reqs, l.auth = up, chans, reqs, authRec
	l.auth["host_key"] = offered
	if !expires.IsZero() {
		l.expires, l.ttl = expires, c.prof.SSH.CertTTL
	}
	return l
}

// authMethod is how the gateway logs in upstream: the host-held key of an
// ssh_host credential bound to the host, else a fresh certificate (then
// expires is when it does).
func (c *conn) authMethod(req policy.Request, rule policy.SSHRule, user string, agentConn *net.Conn) (_ ssh.AuthMethod, _ map[string]any, expires time.Time, _ error) {
	if cred, ok := c.prof.CredentialFor(req); ok && cred.From == policy.SSHAgentSecret {
		if c.g.cfg.AgentSocket == "" {
			return nil, nil, time.Time{}, fmt.Errorf("credential %s: the sandbox's supervisor has no ssh-agent (start it from a shell with SSH_AUTH_SOCK set)", cred.Name)
		}
		return ssh.PublicKeysCallback(func() ([]ssh.Signer, error) {
			ac, err := net.Dial("unix", c.g.cfg.AgentSocket)
			if err != nil {
				return nil, fmt.Errorf("ssh-agent: %w", err)
			}
			if *agentConn != nil {
				(*agentConn).Close()
			}
			*agentConn = ac // closed once the login is over
			return agent.NewClient(ac).Signers()
		}), map[string]any{"auth": "agent", "credential": cred.Name}, time.Time{}, nil
	}
	if cred, ok := c.prof.CredentialFor(req); ok {
		if c.g.cfg.Secret == nil {
			return nil, nil, time.Time{}, fmt.Errorf("credential %s: no secret store", cred.Name)
		}
		b, err := c.g.cfg.Secret(cred.From)
		if err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("credential %s: secret %s is missing from the host store; add it with smx creds", cred.Name, cred.From)
		}
		s, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, nil, time.Time{}, fmt.Errorf("credential %s: secret %s is not an unencrypted SSH private key", cred.Name, cred.From)
		}
		return ssh.PublicKeys(s), map[string]any{"auth": "key", "credential": cred.Name, "secret": cred.From,
			"key": ssh.FingerprintSHA256(s.PublicKey())}, time.Time{}, nil
	}
	ca, err := LoadCA(c.g.cfg.UserCAPath)
	if err != nil {
		return nil, nil, time.Time{}, errors.New("the smx SSH user CA cannot be read; run smx ssh-ca show on the host")
	}
	uc, err := ca.IssueUserCert(CertOptions{User: user, TTL: c.prof.SSH.CertTTL, Sandbox: c.g.cfg.Sandbox,
		Profile: c.prof.Hash, Forward: rule.Forward})
	if err != nil {
		return nil, nil, time.Time{}, err
	}
	validBefore := time.Unix(int64(uc.Cert.ValidBefore), 0)
	return ssh.PublicKeys(uc.Signer), map[string]any{"auth": "certificate", "cert_key_id": uc.Cert.KeyId,
		"cert_serial": fmt.Sprint(uc.Cert.Serial), "cert_valid_before": validBefore.UTC().Format(time.RFC3339)}, validBefore, nil
}

// hostKeyCheck returns the upstream host key check for hostport: the
// rule's pin, else the known_hosts files, and the key algorithms to ask for
// (those known_hosts lists, so a host with several keys is checked against
// the one on file). An unknown host is refused before dialling.
func (c *conn) hostKeyCheck(hostport string, rule policy.SSHRule, ruleID string) (func(string, net.Addr, ssh.PublicKey) *policy.Decision, []string, *policy.Decision) {
	if rule.HostKey != "" {
		return func(_ string, _ net.Addr, key ssh.PublicKey) *policy.Decision {
			if fp := ssh.FingerprintSHA256(key); fp != rule.HostKey {
				return &policy.Decision{Rule: ruleID, Reason: "the host key of " + hostport + " is " + fp +
					", not " + rule.HostKey + " as the profile pins it; it may have been replaced, or the pin is stale"}
			}
			return nil
		}, nil, nil
	}
	var files []string
	for _, f := range c.g.cfg.KnownHosts {
		if st, err := statFile(f); err == nil && st {
			files = append(files, f)
		}
	}
	unknown := &policy.Decision{Rule: RuleHostKeyUnknown, Reason: "the host key of " + hostport + " is not in " +
		strings.Join(c.g.cfg.KnownHosts, " or ") + "; add it on the host (ssh-keyscan, checked) or pin it in the profile (host_key)"}
	if len(files) == 0 {
		return nil, nil, unknown
	}
	kh, err := knownhosts.New(files...)
	if err != nil {
		return nil, nil, &policy.Decision{Rule: RuleHostKeyUnknown, Reason: "known_hosts: " + err.Error()}
	}
	// Which keys are on file for the host: check a key no host has. Plain
	// keys say which algorithms to ask for; an @cert-authority line for the
	// host adds the certificate algorithms (a CA may certify any key type).
	var algos []string
	var ke *knownhosts.KeyError
	if err := kh(hostport, dummyAddr{}, dummyKey{}); errors.As(err, &ke) {
		if len(ke.Want) == 0 {
			return nil, nil, unknown // nothing on file vouches for it: do not even dial
		}
		ca := certAuthorityLines(files)
		anyCA := false
		for _, w := range ke.Want {
			if ca[w.Filename][w.Line] {
				anyCA = true // a CA may certify a host key of any type
				continue
			}
			algos = append(algos, algorithmsFor(w.Key.Type())...)
		}
		if anyCA {
			algos = append(algos, ssh.CertAlgoED25519v01, ssh.CertAlgoECDSA256v01, ssh.CertAlgoECDSA384v01,
				ssh.CertAlgoECDSA521v01, ssh.CertAlgoRSASHA512v01, ssh.CertAlgoRSASHA256v01)
		}
	}
	return func(host string, remote net.Addr, key ssh.PublicKey) *policy.Decision {
		err := kh(host, remote, key)
		if err == nil {
			return nil
		}
		var ke *knownhosts.KeyError
		if errors.As(err, &ke) && len(ke.Want) > 0 {
			return &policy.Decision{Rule: RuleHostKeyChanged, Reason: "the host key of " + hostport + " (" +
				ssh.FingerprintSHA256(key) + ") does not match " + ke.Want[0].Filename + ":" + fmt.Sprint(ke.Want[0].Line) +
				"; it may have been replaced: check with its owner before updating known_hosts"}
		}
		return unknown
	}, algos, nil
}

// certAuthorityLines returns, per file, the line numbers (from 1, as
// knownhosts counts them) of @cert-authority lines.
func certAuthorityLines(files []string) map[string]map[int]bool {
	out := map[string]map[int]bool{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for i, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), "@cert-authority") {
				if out[f] == nil {
					out[f] = map[int]bool{}
				}
				out[f][i+1] = true
			}
		}
	}
	return out
}

// statFile reports whether path is a regular file.
func statFile(path string) (bool, error) {
	st, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	return st.Mode().IsRegular(), nil
}

func algorithmsFor(keyType string) []string {
	if keyType == ssh.KeyAlgoRSA {
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA}
	}
	return []string{keyType}
}

type dummyAddr struct{}

func (dummyAddr) Network() string { return "tcp" }
func (dummyAddr) String() string  { return "192.0.2.1:22" }

// dummyKey is a public key no host has.
type dummyKey struct{}

func (dummyKey) Type() string                            { return "smx-none" }
func (dummyKey) Marshal() []byte                         { return []byte("smx-none") }
func (dummyKey) Verify(_ []byte, _ *ssh.Signature) error { return errors.New("no") }
