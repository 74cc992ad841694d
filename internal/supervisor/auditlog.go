// The sandbox's tamper-evident log (internal/audit), written by this
// process alone while it runs.

package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/smx-dev/smx/internal/audit"
)

// openLog opens the sandbox's log as its single writer for the life of
// this process.
func (s *Supervisor) openLog() error {
	if err := s.opts.State.Ensure(); err != nil {
		return err
	}
	key, err := audit.LoadOrCreatePinnedKey(s.opts.State.Audit())
	if err != nil {
		return fmt.Errorf("supervisor: log key: %w", err)
	}
	l, err := audit.Open(audit.Dir(s.opts.State.Logs(), s.opts.Name), s.opts.Name, key.Signer())
	if err != nil {
		return fmt.Errorf("supervisor: open log: %w", err)
	}
	s.log_ = l
	return nil
}

// audit appends to the sandbox log, once it is open. A record that cannot
// be written (disk full) is reported in the supervisor's own log; the
// sandbox keeps running.
func (s *Supervisor) audit(kind string, fields map[string]any) {
	if <-s.logOpen; s.log_ == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.log_.Append(ctx, kind, fields); err != nil {
		s.log.Error("audit append", "kind", kind, "err", err)
	}
}
