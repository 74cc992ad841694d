package service

import (
	"context"
	"fmt"
	"os"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/learn"
)

// LearnRequest names the log to learn a profile from: a sandbox's (Name)
// or a copy of a log directory (LogDir, e.g. one kept after `smx logs
// prune` elsewhere).
type LearnRequest struct {
	Name   string `json:"name,omitempty"`
	LogDir string `json:"log_dir,omitempty"`
	// PublicKey verifies the log against a key kept elsewhere, as
	// VerifyRequest's does.
	PublicKey string `json:"public_key,omitempty"`
	// ProfileName names the learned profile; "" leaves the name out.
	ProfileName string `json:"profile_name,omitempty"`
	// Refused also learns what was refused (learn.Options.Refused).
	Refused bool `json:"include_refused,omitempty"`
}

// LearnResult is a learned profile and what the learner has to say.
type LearnResult struct {
	YAML  string         `json:"yaml"`
	Notes []string       `json:"notes,omitempty"`
	Rules map[string]int `json:"rules"`
	// Records is how many signed records it was learned from; Unsigned
	// how many later records it left out (not yet covered by a
	// signature, or written by a writer that never closed the log).
	Records  int64 `json:"records"`
	Unsigned int64 `json:"unsigned,omitempty"`
}

// LearnProfile writes the smallest profile that allows what a sandbox's
// log records it did (internal/learn). It reads only a verified log: the
// hash chain, the Merkle tree and the signed checkpoints are checked first
// and a log that fails is refused with the first problem; of a log that
// verifies it reads only the records a signature covers.
func (s *Service) LearnProfile(ctx context.Context, req LearnRequest) (*LearnResult, error) {
	dir, source := req.LogDir, "log "+req.LogDir
	if dir == "" {
		s.awaitDiscard(ctx, req.Name)
		d, err := s.logDir(req.Name)
		if err != nil {
			return nil, err
		}
		dir, source = d, "sandbox "+req.Name
	} else if _, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("no log at %s (a copy of a sandbox's log directory, as under $SMX_HOME/logs): %w", dir, errdefs.ErrNotFound)
	}
	// The records come from the same pass that verified them: nothing
	// can change the file between the check and the read.
	v, all, err := s.verifyDir(dir, req.PublicKey, true)
	if err != nil {
		return nil, err
	}
	rep := v.Report
	if !rep.OK() {
		return nil, fmt.Errorf("the log of %s does not verify, so nothing is learned from it: %s (`smx agent logs NAME --verify` says more): %w",
			source, rep.Problems[0], errdefs.ErrFailed)
	}
	if rep.Latest == nil || rep.Latest.Size == 0 {
		return nil, fmt.Errorf("the log of %s has no signed checkpoint yet: stop the sandbox (or wait a minute) and learn again: %w", source, errdefs.ErrFailed)
	}
	unverified := func(seq int64) bool {
		for _, sp := range rep.Unverified {
			if seq >= sp.From && seq <= sp.To {
				return true
			}
		}
		return false
	}
	var recs []audit.Record
	res := &LearnResult{}
	for _, r := range all {
		if r.Seq >= rep.Latest.Size || unverified(r.Seq) {
			res.Unsigned++
			continue
		}
		recs = append(recs, r)
	}
	res.Records = int64(len(recs))
	lr, err := learn.Learn(recs, learn.Options{Name: req.ProfileName, Refused: req.Refused,
		Source: fmt.Sprintf("%s (%d signed records)", source, len(recs))})
	if err != nil {
		return nil, err
	}
	res.YAML, res.Notes, res.Rules = string(lr.YAML), lr.Notes, lr.Rules
	if res.Unsigned > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("%d records after the last signed checkpoint (or never signed) were left out: stop the sandbox and learn again to include them", res.Unsigned))
	}
	if v.Warning != "" {
		res.Notes = append(res.Notes, v.Warning)
	}
	return res, nil
}
