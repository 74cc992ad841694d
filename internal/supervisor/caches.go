package supervisor

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/cache"
	"github.com/smx-dev/smx/internal/errdefs"
)

// Package caches (internal/cache) are shares of the state dir's
// caches/NAME/data. A shared one is an ordinary read-write share at its
// guest path. A read-only one is shared read-only (the file gateway
// refuses every change) at cacheLower(NAME), and the guest mounts an
// overlay at its guest path whose writable layer is on its own disk; when
// the sandbox stops, promoteCaches copies that layer out and keeps only
// the entries whose bytes match their content address.

// cacheLower is the hidden guest path of read-only cache name's share.
func cacheLower(name string) string { return "/run/smx/caches/" + name }

// promoteCaches takes, for every read-only cache, what the host can verify
// of what the guest wrote over it, within ctx. Called with the guest still
// running, before it powers off; failures are logged and recorded, never
// stop the stop.
func (s *Supervisor) promoteCaches(ctx context.Context) {
	s.shares.mu.Lock()
	list := append([]*share(nil), s.shares.list...)
	s.shares.mu.Unlock()
	for _, sh := range list {
		if sh.cache == nil || sh.cache.Mode != cache.ModeRO {
			continue
		}
		start := time.Now()
		res, err := s.promoteCache(ctx, sh)
		f := map[string]any{"cache": sh.cache.Name, "promoted": res.Promoted, "bytes": res.Bytes, "present": res.Present}
		if res.Refusals > 0 {
			f["refusals"], f["refused"] = res.Refusals, res.Refused
		}
		if err != nil {
			f["error"] = err.Error()
			s.log.Warn("cache promotion", "cache", sh.cache.Name, "err", err)
		}
		s.log.Info("cache promoted", "cache", sh.cache.Name, "promoted", res.Promoted, "present", res.Present,
			"refusals", res.Refusals, "ignored", res.Ignored, "took", time.Since(start))
		if res.Promoted > 0 || res.Refusals > 0 || err != nil {
			s.audit(audit.KindCachePromote, f)
		}
	}
}

// promoteCache copies out the guest's layer over sh and promotes it.
func (s *Supervisor) promoteCache(ctx context.Context, sh *share) (cache.Result, error) {
	sess := s.currentSession()
	if sess == nil {
		return cache.Result{}, fmt.Errorf("no session to the guest agent: %w", errdefs.ErrUnavailable)
	}
	st, err := sess.OpenStream()
	if err != nil {
		return cache.Result{}, err
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Now()) })
	defer stop()
	if err := agentproto.WriteJSON(st, agentproto.FrameRequest, &agentproto.Request{Op: agentproto.OpCopyOut, Path: agentproto.OverlayUpper(sh.tag)}); err != nil {
		return cache.Result{}, err
	}
	pr, pw := io.Pipe()
	go func() {
		var buf []byte
		for {
			t, p, err := agentproto.ReadFrame(st, buf)
			if err != nil {
				pw.CloseWithError(err)
				return
			}
			buf = p[:0]
			switch t {
			case agentproto.FrameData:
				if _, err := pw.Write(p); err != nil {
					return // Promote stopped reading
				}
			case agentproto.FrameEOF:
				pw.Close()
				return
			case agentproto.FrameError:
				pw.CloseWithError(agentproto.DecodeError(p))
				return
			default:
				pw.CloseWithError(fmt.Errorf("unexpected frame %s", t))
				return
			}
		}
	}()
	res, err := cache.Promote(cache.For(s.opts.State).Data(sh.cache.Name), pr, "upper/", cache.DefaultLimits)
	pr.CloseWithError(io.ErrClosedPipe)
	return res, err
}
