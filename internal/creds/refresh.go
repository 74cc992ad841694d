package creds

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Refresher keeps the sign-in credentials a running sandbox uses fresh on
// the host: each one is refreshed Ahead of its expiry, whether or not the
// agent is making requests at that moment, so a request never waits on
// the token endpoint and a sign-in never lapses during a long pause (a
// sandbox paused overnight resumes with a valid token). A secret read
// through Secret that is nevertheless about to expire (the refresher was
// late, or the store was changed under it) is refreshed on the spot, as
// Store.GetFresh does.
//
// Refreshes are single-flight: all go through Store.Refresh, which holds
// a process-wide mutex and the credential's lock file and re-reads the
// expiry under them, so concurrent readers, this loop and other
// supervisors sharing the store exchange a refresh token once. Every
// refresh this process made is reported to Log as a cred.refresh record
// with the secret's name, the new expiry and what triggered it; never a
// token.
type Refresher struct {
	Store Store
	// Ahead is how long before expiry the loop refreshes (default 10
	// minutes); it must exceed refreshBefore for the loop to be the one
	// that refreshes.
	Ahead time.Duration
	// Retry is the pause after a failed refresh (default 1 minute).
	Retry time.Duration
	// Poll bounds every sleep (default 5 minutes), so a sign-in imported
	// again or refreshed by another process is noticed.
	Poll time.Duration
	// Log receives cred.refresh fields: secret, expires_at, trigger
	// ("ahead" or "read") and, on failure, error.
	Log func(fields map[string]any)

	mu    sync.Mutex
	names []string
	wake  chan struct{}
}

// SetNames sets the secrets to keep fresh (those the sandbox's profile
// binds); names without sign-in material are ignored.
func (r *Refresher) SetNames(names []string) {
	r.mu.Lock()
	r.names = slices.Clone(names)
	w := r.wakeLocked()
	r.mu.Unlock()
	select {
	case w <- struct{}{}:
	default:
	}
}

func (r *Refresher) wakeLocked() chan struct{} {
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
	}
	return r.wake
}

func (r *Refresher) ahead() time.Duration { return orDefault(r.Ahead, 10*time.Minute) }

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// Run refreshes until ctx ends.
func (r *Refresher) Run(ctx context.Context) {
	r.mu.Lock()
	wake := r.wakeLocked()
	r.mu.Unlock()
	for {
		sleep := r.refreshDue(ctx)
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// refreshDue refreshes every sign-in within Ahead of its expiry and says
// how long to sleep until the next one is due.
func (r *Refresher) refreshDue(ctx context.Context) time.Duration {
	r.mu.Lock()
	names := slices.Clone(r.names)
	r.mu.Unlock()
	sleep := orDefault(r.Poll, 5*time.Minute)
	for _, name := range names {
		o, err := r.Store.OAuthOf(name)
		if err != nil {
			continue // a plain secret, or not stored yet
		}
		next := time.Until(o.ExpiresAt) - r.ahead()
		if next <= 0 {
			if err := r.refresh(ctx, name, r.ahead(), "ahead"); err != nil {
				next = orDefault(r.Retry, time.Minute)
			} else if o, err = r.Store.OAuthOf(name); err == nil {
				next = time.Until(o.ExpiresAt) - r.ahead()
			}
		}
		sleep = min(sleep, max(next, time.Second))
	}
	return sleep
}

// refresh refreshes name when it expires within `within`, and logs what
// it did. Not refreshing because another caller just did is no error.
func (r *Refresher) refresh(ctx context.Context, name string, within time.Duration, trigger string) error {
	done, err := r.Store.Refresh(ctx, name, within)
	if err == nil && !done {
		return nil
	}
	f := map[string]any{"secret": name, "trigger": trigger}
	if err != nil {
		f["error"] = err.Error()
	} else if o, oerr := r.Store.OAuthOf(name); oerr == nil {
		f["expires_at"] = o.ExpiresAt.UTC().Format(time.RFC3339)
		if o.Source != "" {
			f["source"] = o.Source
		}
	}
	if r.Log != nil {
		r.Log(f)
	}
	return err
}

// Secret reads name for the gateway, as Store.GetFresh: a sign-in about
// to expire is refreshed first (logged with trigger "read"); a failed
// refresh still returns a token that has not expired yet.
func (r *Refresher) Secret(name string) ([]byte, error) {
	o, err := r.Store.OAuthOf(name)
	if errors.Is(err, errdefs.ErrNotFound) {
		return r.Store.Get(name)
	}
	if err != nil {
		return nil, err
	}
	if time.Until(o.ExpiresAt) > refreshBefore {
		return r.Store.accessOf(name, o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.refresh(ctx, name, refreshBefore, "read"); err != nil && time.Now().After(o.ExpiresAt) {
		return nil, err
	}
	return r.Store.Get(name)
}
