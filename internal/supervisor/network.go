package supervisor

import (
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/gitgw"
	"github.com/smx-dev/smx/internal/netstack"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/supproto"
	"github.com/smx-dev/smx/internal/tlsgw"
	"github.com/smx-dev/smx/internal/usage"
)

// The guest's network: one NIC on a private /24 whose only other end is
// the supervisor's gateway. Every sandbox has the same addresses: each has
// its own gateway, so they never meet.
var (
	guestIP   = netip.MustParseAddr("10.0.2.15")
	gatewayIP = netip.MustParseAddr("10.0.2.2")
	guestMAC  = "52:54:00:12:34:56"
	// linkMTU is the NIC's MTU. The link is a datagram socketpair, not a
	// wire: 64 KB frames cut the per-packet cost (a TCG guest's dominant
	// one) by some forty times against 1500.
	linkMTU = 65000
)

// netCmdline tells smx-agent how to configure the NIC.
func netCmdline() string {
	return fmt.Sprintf(" smx.net=%s/24,%s,%d", guestIP, gatewayIP, linkMTU)
}

// loadProfile reads the sandbox's frozen profile (profile.yaml, written at
// create), falling back to resolving the name for sandboxes made before
// profiles were frozen. Its rules cite the user's file and line
// (policy.LoadFrozen).
func (s *Supervisor) loadProfile() (*policy.Profile, error) {
	prof, err := s.loadFrozen()
	if err != nil {
		return nil, err
	}
	// A worktree sandbox is narrowed to its branch whatever profile it
	// has now (`smx profile set` keeps the narrowing).
	if wt := s.spec.Worktree; wt != nil {
		prof.Worktree(wt.GitDir, wt.Name, wt.Branch)
	}
	return prof, nil
}

func (s *Supervisor) loadFrozen() (*policy.Profile, error) {
	if _, err := os.Stat(s.paths.Profile()); err == nil {
		return policy.LoadFrozen(s.paths.Profile())
	}
	ref := s.spec.Profile
	if ref == "" {
		ref = "locked"
	}
	return policy.Resolve(ref)
}

// netLink makes the datagram socketpair QEMU's `-netdev dgram` uses: one
// Ethernet frame per datagram. The host end's buffers are raised so bursts
// are not dropped (the default queue is 10 datagrams).
func netLink() (host, guest *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("supervisor: network socketpair: %w", err)
	}
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	return os.NewFile(uintptr(fds[0]), "net-host"), os.NewFile(uintptr(fds[1]), "net-guest"), nil
}

// startNetwork puts the gateway on the host end of the link. Every new
// flow and every DNS name asks the profile; refusals are always logged and
// allowed flows are logged as summaries when they end.
func (s *Supervisor) startNetwork(link *os.File, prof *policy.Profile) error {
	mac, _ := net.ParseMAC(guestMAC)
	ca, err := tlsgw.LoadOrCreate(s.paths.Dir, s.spec.Name)
	if err != nil {
		return fmt.Errorf("supervisor: network: %w", err)
	}
	s.ca = ca
	store := creds.Store{Dir: s.opts.State.Creds()}
	// Sign-ins are refreshed on the host ahead of expiry while the
	// sandbox runs (and on read when that was late); cred.refresh records
	// say so, never with a token.
	s.fresh = &creds.Refresher{Store: store, Log: func(f map[string]any) { s.audit(audit.KindCredRefresh, f) }}
	s.fresh.SetNames(secretNames(prof))
	s.background(s.fresh.Run)
	hostPorts := map[uint16]uint16{}
	for _, hp := range prof.Network.HostPorts {
		hostPorts[hp.Port] = hp.Port
	}
	s.git = gitgw.New(gitgw.Config{
		Secret:  s.fresh.Secret,
		Log:     s.audit,
		Mirrors: &gitgw.Mirrors{Dir: filepath.Join(s.paths.Dir, "git-mirrors")},
		Ask:     s.askGit,
	}, prof)
	// What brokered model requests cost is counted in the sandbox's
	// directory, beside its log: a restarted supervisor carries on from
	// it, a snapshot restore does not roll it back (the tokens were
	// spent), and a fork, a new sandbox with its own log, starts its own.
	meter, err := usage.NewMeter(usage.File(s.paths.Dir), nil)
	if err != nil {
		s.log.Warn("usage totals unreadable; counting from zero", "err", err)
		meter, _ = usage.NewMeter("", nil)
	}
	s.defer_(meter.Close)
	st, err := netstack.New(netstack.Config{
		GuestIP:       guestIP,
		GatewayIP:     gatewayIP,
		MAC:           mac,
		MTU:           linkMTU,
		Policy:        s.grantedPolicy(netPolicy(prof)),
		Ask:           s.askNet,
		AskCredential: s.askCred,
		AskBudget:     s.askBudget,
		HostPorts:     hostPorts,
		Local:         s.localService, // why.go: smx-why, then the file gateway
		Resolver:      s.resolver(),

		Credentials:   netstack.ProfileCredentials(prof),
		Secret:        s.fresh.Secret,
		CA:            ca,
		UpstreamRoots: s.upstreamRoots(),
		Forge:         s.git,
		Meter:         meter,
		Activity:      s.act.touch,
		Log: func(e netstack.Event) {
			f := e.Fields()
			if v := s.view.Load(); v != nil && e.Kind == audit.KindNetRefused && e.Decision.Rule != "" {
				f["profile"] = v.name // the rule cites the user's file and line; this names the profile
			}
			s.audit(e.Kind, f)
		},
	}, link)
	if err != nil {
		return fmt.Errorf("supervisor: network: %w", err)
	}
	s.net = st
	s.netReady.Store(st)
	go s.watchLostEvents(st)
	s.profile = prof
	s.setView(prof)
	s.defer_(st.Close)
	return s.startSSH(st, prof)
}

// secretNames are the host-store secrets prof's credentials use.
func secretNames(prof *policy.Profile) []string {
	var out []string
	for _, c := range prof.Credentials {
		out = append(out, c.From)
	}
	return out
}

// resolver is the host's resolver, or a hosts file named by
// SMX_HOSTS_FILE: a host-side setting (like /etc/hosts) for test hosts;
// never settable from a profile or from the guest. The file is read again
// when it changes.
func (s *Supervisor) resolver() netstack.Resolver {
	if p := os.Getenv("SMX_HOSTS_FILE"); p != "" {
		r, err := netstack.NewHostsFileResolver(p)
		if err == nil {
			return r
		}
		s.log.Warn("SMX_HOSTS_FILE", "err", err)
	}
	return nil
}

// upstreamRoots are the roots brokered upstreams are verified against:
// the system's, plus the PEM certificates in SMX_EXTRA_CA_FILE, a host-side
// setting for test upstreams (never settable from a profile or the guest).
func (s *Supervisor) upstreamRoots() *x509.CertPool {
	p := os.Getenv("SMX_EXTRA_CA_FILE")
	if p == "" {
		return nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	b, err := os.ReadFile(p)
	if err != nil || !pool.AppendCertsFromPEM(b) {
		s.log.Warn("SMX_EXTRA_CA_FILE: no certificates added", "path", p, "err", err)
	}
	return pool
}

// setProfile switches the running sandbox to the profile frozen in
// profile.yaml: new flows follow it at once and live flows it no longer
// allows are closed.
func (s *Supervisor) setProfile() (int, error) {
	// Two changes at once apply (and are logged) one after the other.
	s.profMu.Lock()
	defer s.profMu.Unlock()
	prof, err := s.loadProfile()
	if err != nil {
		return 0, err
	}
	old := ""
	if s.profile != nil {
		old = s.profile.Hash
	}
	s.profile = prof
	s.setView(prof)
	s.setShareProfile(prof)
	closed := 0
	if s.net != nil {
		s.net.SetPolicy(s.grantedPolicy(netPolicy(prof)))
		s.setSSHProfile(prof)
		s.net.SetCredentials(netstack.ProfileCredentials(prof))
		s.git.SetProfile(prof)
		s.fresh.SetNames(secretNames(prof))
		closed = s.net.Reevaluate()
	}
	s.audit(audit.KindProfileChange, map[string]any{
		"old_hash": old, "new_hash": prof.Hash, "profile": prof.Name, "closed_flows": closed,
	})
	return closed, nil
}

func (s *Supervisor) handleSetProfile(c io.Writer) {
	n, err := s.setProfile()
	if err != nil {
		supproto.WriteError(c, err)
		return
	}
	supproto.WriteResult(c, supproto.Result{OK: true, ClosedFlows: n})
}

// watchLostEvents turns events the gateway had to drop (its queue to the
// log overflowed under a flood) into a record of how many were lost, so a
// gap in the refusals is itself on the record. It ends when the stack is
// closed (Stats keeps answering; the supervisor exits soon after).
func (s *Supervisor) watchLostEvents(st *netstack.Stack) {
	var seen int64
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-s.stopping:
			return
		case <-t.C:
		}
		if lost := st.Stats().EventsLost; lost > seen {
			s.audit("net.events_lost", map[string]any{"lost": lost - seen, "lost_total": lost, "refused": true})
			seen = lost
		}
	}
}

// profileView is what the log writers need of the current profile, read
// from any goroutine.
type profileView struct {
	name     string
	redactor *audit.Redactor
}

// redactor removes secrets from recorded command lines: the profile's
// log.redact patterns and the built-in token shapes (audit.Redactor; nil
// applies the built-in shapes).
func (s *Supervisor) redactor() *audit.Redactor {
	if v := s.view.Load(); v != nil {
		return v.redactor
	}
	return nil
}

// setView compiles what the log needs of prof.
func (s *Supervisor) setView(prof *policy.Profile) {
	pats := make([]string, len(prof.Log.Redact))
	for i, r := range prof.Log.Redact {
		pats[i] = r.Pattern
	}
	v := &profileView{name: prof.Name}
	if r, err := audit.NewRedactor(pats); err == nil { // validated when the profile was parsed
		v.redactor = r
	}
	s.view.Store(v)
}
