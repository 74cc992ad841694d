// Requests to the guest agent that the supervisor alone makes: one-shot
// calls, and the sync of clock, entropy and CAs after a boot or restore.

package supervisor

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
)

// syncGuest sets the guest's clock and seeds its entropy pool: the guest
// has no RTC it can trust after a pause or a restore, and starts with an
// empty pool (or, restored, with the same pool as every other fork of its
// snapshot). After a restore it also sets the hostname, which a fork
// inherits from its source otherwise. The requests are independent, so
// they go out at once, each on its own stream: the start waits for one
// guest round trip instead of one per request. Their failures are logged;
// that of setting the clock is also returned, which after a restore
// proves the new session works (a separate health request cost the start
// its own guest code, translated afresh under TCG).
func (s *Supervisor) syncGuest(ctx context.Context, restored bool) error {
	seed := make([]byte, 64)
	rand.Read(seed)
	reqs := []*agentproto.Request{
		{Op: agentproto.OpSetTime, TimeUnixNano: time.Now().UnixNano()},
		{Op: agentproto.OpAddEntropy, Entropy: seed},
	}
	if restored {
		reqs = append(reqs, &agentproto.Request{Op: agentproto.OpSetHostname, Hostname: s.spec.Name})
	}
	// Every boot and every restore: a fork has its own CAs, and the guest
	// must trust them (and no longer its source's); a guest restored from
	// a template already trusts the template's, which its sandbox adopted.
	var guestCA []byte
	var guestSSHCA string
	if restored && s.restore != nil {
		guestCA, guestSSHCA = s.restore.guestCA, s.restore.guestSSHCA
	}
	if s.ca != nil && !bytes.Equal(guestCA, s.ca.CertPEM()) {
		reqs = append(reqs, &agentproto.Request{Op: agentproto.OpInstallCA, CACert: s.ca.CertPEM()})
	}
	if s.ssh.hostCA != nil && guestSSHCA != s.ssh.hostCA.AuthorizedKey() {
		reqs = append(reqs, s.sshGuestRequests()...)
	}
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, errs[i] = s.call(cctx, req)
			cancel()
			s.trace(req.Op)
			if errs[i] != nil {
				s.log.Warn("guest setup", "op", req.Op, "err", errs[i])
			}
		})
	}
	wg.Wait()
	return errs[0] // the clock
}

// call makes one one-shot request to the guest agent.
func (s *Supervisor) call(ctx context.Context, req *agentproto.Request) (*agentproto.Result, error) {
	sess := s.currentSession()
	if sess == nil {
		return nil, fmt.Errorf("supervisor: no session to the guest agent: %w", errdefs.ErrUnavailable)
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, err
	}
	defer st.Close()
	// A yamux Close is a half-close: only a deadline unblocks our Read
	// when the guest never answers.
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, req); err != nil {
		return nil, err
	}
	r, err := agentproto.ReadResult(st)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return r, err
}
