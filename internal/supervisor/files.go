package supervisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/cache"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/fsgw"
	"github.com/smx-dev/smx/internal/policy"
)

// Host folders: one file gateway per mount, each serving 9P on its own
// control-channel stream (see internal/fsgw and docs/architecture.md).

// shareSet is the sandbox's mounts and the profile their gateways decide
// with (swapped by setProfile).
type shareSet struct {
	profile atomic.Pointer[policy.Profile]
	mu      sync.Mutex
	list    []*share
	// nextTag numbers the next mount added to the running sandbox (tag
	// "m" + nextTag): a tag is never used twice in one start, so nothing
	// the guest kernel still holds of a removed mount names a new one.
	nextTag int
}

type share struct {
	tag   string
	host  string
	mount policy.FileMount
	owner fsgw.Owner // guest owner of the host user's files
	port  int        // TCP transports: the gateway port the guest connects to
	relay bool       // smx-agent holds the connection (transport "relay")
	gw    *fsgw.Gateway
	// cache, for a package cache (internal/cache): its use; a read-only
	// one is shared read-only at a hidden path with an overlay at
	// cache.Guest (see caches.go).
	cache *cache.Use
}

// request is the guest's mount request for sh.
func (sh *share) request() *agentproto.MountRequest {
	req := &agentproto.MountRequest{Tag: sh.tag, Path: sh.mount.Guest, ReadOnly: sh.mount.ReadOnly}
	if sh.cache != nil && sh.cache.Mode == cache.ModeRO {
		req.Overlay, req.UID, req.GID = sh.cache.Guest, sh.cache.UID, sh.cache.GID
	}
	return req
}

// shareBasePort is the first gateway port of the TCP transport (9P's
// registered port is 564; one port per mount from 5640).
const shareBasePort = 5640

// shareTransport is how guests reach the file gateway: "tcp" (the guest
// kernel's 9P client connects to the gateway address, served in-process by
// the network stack; files open at a snapshot fail after its restore),
// "relay" (smx-agent connects and carries the kernel's 9P messages, so
// that the session is rebuilt after a restore and open files keep
// working; metadata costs about 3x more guest CPU) or "fd" (a
// control-channel stream relayed by smx-agent).
// SMX_FILES_TRANSPORT, a host-side setting, overrides it for measurements.
// See docs/architecture.md for the numbers behind the default.
func shareTransport() string {
	if t := os.Getenv("SMX_FILES_TRANSPORT"); t == "fd" || t == "tcp" || t == "relay" {
		return t
	}
	return "tcp"
}

// shareService is the network stack's Config.Local: the 9P service for a
// connection to the gateway's port, if a mount uses it.
func (s *Supervisor) shareService(port uint16) func(net.Conn) {
	s.shares.mu.Lock()
	defer s.shares.mu.Unlock()
	for _, sh := range s.shares.list {
		if sh.port != 0 && sh.port == int(port) {
			gw, mount := sh.gw, sh.mount.Guest
			return func(c net.Conn) {
				// The guest kernel connects from a privileged port
				// (mount option privport); a guest process that could
				// not bind one (not root in the guest) would otherwise
				// speak 9P past the guest's own permission checks.
				if ra, ok := c.RemoteAddr().(*net.TCPAddr); !ok || ra.Port >= 1024 {
					s.audit(audit.KindFileRefused, map[string]any{"op": "connect", "path": mount, "mount": mount,
						"rule": "builtin: file gateway", "reason": fmt.Sprintf("9P connection from unprivileged port %v", c.RemoteAddr())})
					c.Close()
					return
				}
				gw.Serve(c)
			}
		}
	}
	return nil
}

// isGitDir reports whether host directory dir is a git directory as git
// finds one: HEAD, objects and refs in it.
func isGitDir(dir string) bool {
	h, err1 := os.Lstat(filepath.Join(dir, "HEAD"))
	o, err2 := os.Stat(filepath.Join(dir, "objects"))
	r, err3 := os.Stat(filepath.Join(dir, "refs"))
	return err1 == nil && err2 == nil && err3 == nil && !h.IsDir() && o.IsDir() && r.IsDir()
}

// checkGitDir refuses a writable mount of a git directory at a guest path
// that does not end in .git: the profile protects a git directory's
// config and hooks by the guest path (…/.git/config, …/NAME.git/hooks);
// mounted under another name they would be the guest's to write.
func checkGitDir(host, guest string, ro, unprotected bool, rule string) error {
	if !ro && !unprotected && isGitDir(host) && !strings.HasSuffix(strings.ToLower(guest), ".git") {
		return fmt.Errorf("supervisor: %s: %s is a git directory (HEAD, objects, refs): mount it at a guest path ending in .git, mount its parent, or add :ro: %w", rule, host, errdefs.ErrInvalid)
	}
	return nil
}

// shareList is the -v mounts followed by the profile's files.mounts.
func (s *Supervisor) shareList(prof *policy.Profile) ([]*share, error) {
	var out []*share
	seen := map[string]string{}
	// claim takes guest path guest for rule: one mount per path.
	claim := func(guest, rule string) error {
		if prev, ok := seen[guest]; ok {
			return fmt.Errorf("supervisor: %s is mounted twice (%s and %s): %w", guest, prev, rule, errdefs.ErrInvalid)
		}
		seen[guest] = rule
		return nil
	}
	add := func(host, guest string, ro, unprotected bool, owner fsgw.Owner, rule string) error {
		if err := claim(guest, rule); err != nil {
			return err
		}
		if err := checkGitDir(host, guest, ro, unprotected, rule); err != nil {
			return err
		}
		out = append(out, &share{
			tag:   "m" + strconv.Itoa(len(out)),
			host:  host,
			mount: policy.FileMount{Guest: guest, ReadOnly: ro, Unprotected: unprotected, Rule: rule},
			owner: owner,
		})
		return nil
	}
	for _, m := range s.spec.Mounts {
		if err := add(m.Host, m.Guest, m.ReadOnly, m.Unprotected, fsgw.Owner{UID: m.UID, GID: m.GID}, "-v "+m.String()); err != nil {
			return nil, err
		}
	}
	if prof != nil {
		for i, m := range prof.Files.Mounts {
			rule := fmt.Sprintf("%s files.mounts[%d] %s:%s", m.Pos, i, m.Host, m.Guest)
			if err := add(m.Host, m.Guest, false, false, fsgw.Owner{UID: m.UID, GID: m.GID}, rule); err != nil {
				return nil, err
			}
		}
	}
	for _, c := range s.spec.Caches {
		rule := "--volume-cache " + c.String()
		data := cache.For(s.opts.State).Data(c.Name)
		owner := fsgw.Owner{UID: c.UID, GID: c.GID}
		if c.Mode == cache.ModeShared {
			if err := add(data, c.Guest, false, false, owner, rule); err != nil {
				return nil, err
			}
		} else {
			// The overlay takes the guest path; the share sits below it.
			if err := claim(c.Guest, rule); err != nil {
				return nil, err
			}
			if err := add(data, cacheLower(c.Name), true, false, owner, rule); err != nil {
				return nil, err
			}
		}
		out[len(out)-1].cache = &c
	}
	return out, nil
}

// sharesCmdline tells the guest to load the 9p modules at boot.
func (s *Supervisor) sharesCmdline(prof *policy.Profile) string {
	if len(s.spec.Mounts) > 0 || len(s.spec.Caches) > 0 || prof != nil && len(prof.Files.Mounts) > 0 {
		return " smx.shares=1"
	}
	return ""
}

// attachShares opens a gateway for every mount and has the guest mount it.
// A mount that fails fails the start, with the reason. Over virtio-fs the
// gateways are open already (startVirtioFS).
func (s *Supervisor) attachShares(ctx context.Context, prof *policy.Profile) error {
	if s.vfs != nil {
		return s.mountVirtioFS(ctx)
	}
	list, err := s.shareList(prof)
	if err != nil {
		return err
	}
	s.shares.profile.Store(prof)
	s.shares.nextTag = len(list)
	for _, sh := range list {
		if err := s.openGateway(sh); err != nil {
			return err
		}
		if t := shareTransport(); t != "fd" {
			sh.port = shareBasePort + len(s.shares.list)
			sh.relay = t == "relay"
		}
		s.shares.mu.Lock()
		s.shares.list = append(s.shares.list, sh)
		s.shares.mu.Unlock()
		if err := s.mountShare(ctx, sh); err != nil {
			return err
		}
	}
	return nil
}

// openGateway opens sh's file gateway, deciding with the sandbox's
// current profile, and closes it when the supervisor ends.
func (s *Supervisor) openGateway(sh *share) error {
	gw, err := s.newGateway(sh)
	if err != nil {
		return err
	}
	sh.gw = gw
	s.defer_(gw.Close)
	return nil
}

// newGateway opens the file gateway of one mount.
func (s *Supervisor) newGateway(sh *share) (*fsgw.Gateway, error) {
	ask := func(ctx context.Context, q fsgw.Question) fsgw.Answer { return s.askFile(ctx, q, nil) }
	if vfs := s.vfs; vfs != nil {
		// The virtio-fs device's request queue is served one request at
		// a time: a request about to wait hands the queue over first.
		ask = func(ctx context.Context, q fsgw.Question) fsgw.Answer { return s.askFile(ctx, q, vfs.Hold) }
	}
	gw, err := fsgw.New(fsgw.Config{
		Ask:     ask,
		Host:    sh.host,
		Mount:   sh.mount,
		Profile: s.shares.profile.Load,
		Refused: func(f map[string]any) {
			f["mount"] = sh.mount.Guest
			s.audit(audit.KindFileRefused, f)
		},
		Wrote: func(f map[string]any) {
			f["mount"] = sh.mount.Guest
			s.audit(audit.KindFileWrite, f)
		},
		Log:   s.log.With("mount", sh.mount.Guest),
		Owner: sh.owner,
	})
	if err != nil {
		return nil, fmt.Errorf("supervisor: mount %s: %w", sh.mount.Rule, err)
	}
	return gw, nil
}

func (s *Supervisor) mountShare(ctx context.Context, sh *share) error {
	req := sh.request()
	if sh.port != 0 {
		req.Addr, req.Port, req.Relay = gatewayIP.String(), sh.port, sh.relay
		return s.guestMount(ctx, sh, req)
	}
	st, err := s.currentSession().OpenStream()
	if err != nil {
		return fmt.Errorf("supervisor: mount %s: %w", sh.mount.Guest, err)
	}
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, &agentproto.Request{Op: agentproto.OpMountData, Mount: req}); err != nil {
		st.Close()
		return fmt.Errorf("supervisor: mount %s: %w", sh.mount.Guest, err)
	}
	go func() {
		// Ends when the guest unmounts, the session ends, or the guest
		// sends something that is not 9P; the supervisor and the other
		// mounts go on.
		sh.gw.Serve(st)
		s.log.Info("share session ended", "mount", sh.mount.Guest)
	}()
	return s.guestMount(ctx, sh, req)
}

func (s *Supervisor) guestMount(ctx context.Context, sh *share, req *agentproto.MountRequest) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := s.call(cctx, &agentproto.Request{Op: agentproto.OpMount, Mount: req}); err != nil {
		return fmt.Errorf("supervisor: mount %s at %s in the guest: %w", sh.host, sh.mount.Guest, err)
	}
	s.log.Info("mounted", "host", sh.host, "guest", sh.mount.Guest, "ro", sh.mount.ReadOnly, "port", sh.port)
	return nil
}

// setShareProfile makes the gateways decide with prof from the next
// operation on.
func (s *Supervisor) setShareProfile(prof *policy.Profile) {
	s.shares.profile.Store(prof)
}

// mountStrings is the -v mounts in their notation, for a snapshot.
func (s *Supervisor) mountStrings() []string {
	var out []string
	for _, m := range s.spec.Mounts {
		out = append(out, m.String())
	}
	return out
}
