// Package sshgw is the SSH gateway: it terminates the SSH connections a
// sandbox's guest opens to hosts its profile's ssh section names, and opens
// the session upstream on the guest's behalf with a key the guest never
// sees.
//
// Towards the guest the gateway is an SSH server (golang.org/x/crypto/ssh)
// whose host key is certified by the sandbox's own SSH host CA, which
// smx-agent writes into the guest's /etc/ssh/ssh_known_hosts as an
// @cert-authority line. The guest authenticates with nothing (any key is
// accepted too): it holds no key that works anywhere else.
//
// Upstream the gateway logs in as the user the guest asked for, with a
// certificate from the smx user CA that lives ssh.cert_ttl, names the
// sandbox and the profile hash, and permits forwarding only where the rule
// does; or, for a host with an ssh_host credential, with that host-held
// key. The upstream host key must be in the host user's known_hosts or
// match the rule's host_key pin.
//
// Every channel and request is filtered: session exec, shell, pty-req,
// window-change, signal and env (allow-listed names) pass; the sftp
// subsystem (and scp) only if the rule allows it; direct-tcpip (-L, -D,
// -J), tcpip-forward (-R), agent and X11 forwarding only as the rule's
// forward list says, and a direct-tcpip destination only when the
// profile's network rules allow it. A live connection ends when its
// certificate expires or a profile change no longer allows it (live.go). Each session is an ssh.session record and each
// refusal an ssh.refused record naming the request and the rule.
//
// Git over SSH (git-upload-pack, git-receive-pack) is decided by a GitGate
// at repository level and, for a push, ref by ref by the Git gateway's push
// filter; see git.go and gitpush.go.
package sshgw

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/policy"
)

// Config describes one sandbox's SSH gateway.
type Config struct {
	Sandbox string
	// GitAsk puts a pushed ref a rule says ask about to the host user
	// (gitgw.AskRefs), as the Git gateway over HTTPS does; nil refuses it.
	GitAsk gitgw.AskFunc
	// Ask puts a login an ssh allow rule with ask: true matched to the
	// host user and blocks until the answer (what reads e.g. "ssh
	// deploy@build1 port 22"); nil refuses such logins.
	Ask func(ctx context.Context, req policy.Request, d policy.Decision, what string) (allow bool, reason string)
	// HostCA signs the host certificates the guest sees.
	HostCA *CA
	// UserCAPath is the smx user CA's file. It is read for each new
	// connection, so `smx ssh-ca rotate` takes effect at once.
	UserCAPath string
	// KnownHosts are the host user's known_hosts files upstream host keys
	// are checked against (missing files are skipped). nil means
	// DefaultKnownHosts().
	KnownHosts []string
	// Secret reads an ssh_host credential's private key from the host
	// store by secret name.
	Secret func(name string) ([]byte, error)
	// AgentSocket is the host user's ssh-agent, used only for ssh_host
	// credentials whose from is policy.SSHAgentSecret; "" means none.
	AgentSocket string
	// Dial dials upstream from the host; nil means a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Git decides Git over SSH; nil means RepoGate{}.
	Git GitGate
	// GitMirrors keeps the host-side mirrors pushes are checked for
	// fast-forward against (see gitgw.Mirrors); nil refuses every update
	// that would need the check.
	GitMirrors *gitgw.Mirrors
	// Log receives audit records (kind, fields); it must not block long.
	Log func(kind string, fields map[string]any)
	// Logger gets debugging detail; nil discards it.
	Logger *slog.Logger
	// Timeout bounds the upstream dial and handshake; 0 means 20 s.
	Timeout time.Duration
}

// Audit record kinds the gateway writes, besides audit.KindSSHRefused.
const (
	KindSession = audit.KindSSHSession
	KindForward = audit.KindSSHForward
)

// Target is where the guest's connection was going.
type Target struct {
	Host string         // the name the guest looked up, or "" for a raw address
	Addr netip.AddrPort // the address dialled
	// Refusal is set for a connection the network policy refused: the
	// gateway only tells the guest why (and logs ssh.refused with the ssh
	// section's verdict on the user); it never dials.
	Refusal *policy.Decision
}

func (t Target) name() string {
	if t.Host != "" {
		return t.Host
	}
	return t.Addr.Addr().String()
}

// Gateway terminates guest SSH connections. Its methods are safe for
// concurrent use. Close ends every connection it serves.
type Gateway struct {
	cfg     Config
	hostKey ssh.Signer // the gateway's own key; certified per target
	prof    atomic.Pointer[policy.Profile]
	log     *slog.Logger

	mu     sync.Mutex
	conns  map[*conn]struct{}
	closed bool
}

// New makes a gateway for p.
func New(cfg Config, p *policy.Profile) (*Gateway, error) {
	if cfg.HostCA == nil || cfg.UserCAPath == "" {
		return nil, errors.New("sshgw: HostCA and UserCAPath are required")
	}
	if cfg.KnownHosts == nil {
		cfg.KnownHosts = DefaultKnownHosts()
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{}).DialContext
	}
	if cfg.Git == nil {
		cfg.Git = RepoGate{}
	}
	if cfg.Log == nil {
		cfg.Log = func(string, map[string]any) {}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 20 * time.Second
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("sshgw: host key: %w", err)
	}
	hk, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("sshgw: host key: %w", err)
	}
	g := &Gateway{cfg: cfg, hostKey: hk, log: lg, conns: map[*conn]struct{}{}}
	g.SetProfile(p)
	return g, nil
}

// DefaultKnownHosts are the files upstream host keys are checked against:
// SMX_SSH_KNOWN_HOSTS (colon-separated; a host-side setting, for tests and
// for keeping smx's list apart, never read from a profile or the guest), else
// ~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts.
func DefaultKnownHosts() []string {
	if v := os.Getenv("SMX_SSH_KNOWN_HOSTS"); v != "" {
		return filepath.SplitList(v)
	}
	out := []string{}
	if home, err := os.UserHomeDir(); err == nil {
		out = append(out, filepath.Join(home, ".ssh", "known_hosts"))
	}
	return append(out, "/etc/ssh/ssh_known_hosts")
}

// Explains reports whether a refused TCP flow to host:port should be
// answered by the gateway in SSH (port 22, or a host an ssh allow rule
// names on some port) rather than reset, so the agent reads why.
func (g *Gateway) Explains(host string, port uint16) bool {
	if port == 22 {
		return true
	}
	p := g.prof.Load()
	if p == nil || host == "" {
		return false
	}
	_, ok := p.SSHName(host)
	return ok
}

// SetProfile switches new connections to p and decides live ones again
// (live.go): a connection p no longer allows as it was opened, or a
// forward whose destination p refuses, is closed with an ssh.refused
// record. It returns once they are closed.
func (g *Gateway) SetProfile(p *policy.Profile) {
	g.prof.Store(p)
	g.mu.Lock()
	cs := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		cs = append(cs, c)
	}
	g.mu.Unlock()
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() { defer wg.Done(); c.recheck(p) }()
	}
	wg.Wait()
}

// Close ends every connection. It is idempotent.
func (g *Gateway) Close() error {
	g.mu.Lock()
	g.closed = true
	cs := make([]*conn, 0, len(g.conns))
	for c := range g.conns {
		cs = append(cs, c)
	}
	g.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
	return nil
}

// Serve runs the SSH server side on guest, a connection the guest opened to
// t, until either side ends it. It closes guest.
func (g *Gateway) Serve(ctx context.Context, guest net.Conn, t Target) {
	c := &conn{g: g, t: t, guest: guest, prof: g.prof.Load(), start: time.Now()}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		guest.Close()
		return
	}
	g.conns[c] = struct{}{}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		delete(g.conns, c)
		g.mu.Unlock()
		c.close()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { <-ctx.Done(); c.close() }()
	c.serve(ctx)
}

// refuse writes an ssh.refused record and returns the one line the guest
// is shown.
func (g *Gateway) refuse(t Target, user, request string, d policy.Decision, extra map[string]any) string {
	f := map[string]any{"host": t.name(), "dst": t.Addr.String(), "port": int(t.Addr.Port()),
		"request": request, "rule": d.Rule, "reason": d.Reason}
	if user != "" {
		f["user"] = user
	}
	for k, v := range extra {
		f[k] = v
	}
	g.cfg.Log(audit.KindSSHRefused, f)
	return "smx: " + d.Reason + " (rule: " + d.Rule + ")"
}

// Rules the gateway itself refuses by, besides the profile's.
const (
	RuleHostKeyUnknown = "sshgw: upstream host key unknown"
	RuleHostKeyChanged = "sshgw: upstream host key changed"
	RuleUpstream       = "sshgw: upstream"
	RuleCredential     = "sshgw: credential"
	RuleRequest        = "sshgw: request not supported"
)

func portStr(p uint16) string { return strconv.Itoa(int(p)) }

func quoteCmd(s string) string {
	if len(s) > 512 {
		s = s[:512] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
