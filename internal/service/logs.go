package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
)

// LogsRequest selects records of a sandbox's log. The sandbox need not
// exist any more: logs stay after rm until pruned.
type LogsRequest struct {
	Name   string       `json:"name"`
	Filter audit.Filter `json:"filter"`
	// Follow keeps calling back with new records until ctx ends (then
	// Logs returns nil).
	Follow bool `json:"follow,omitempty"`
}

func (s *Service) logDir(name string) (string, error) {
	dir := audit.Dir(s.state.Logs(), name)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("no log for sandbox %s (`smx logs ls` lists logs): %w", name, errdefs.ErrNotFound)
	}
	return dir, nil
}

// Logs calls fn with each record req selects, in order. It reads without
// the writer's lock, so it works while the supervisor appends; it does not
// check hashes (VerifyLog does). An error from fn stops it and is returned.
func (s *Service) Logs(ctx context.Context, req LogsRequest, fn func(audit.Record) error) error {
	s.awaitDiscard(ctx, req.Name)
	dir, err := s.logDir(req.Name)
	if err != nil {
		return err
	}
	if req.Follow {
		return audit.Follow(ctx, dir, req.Filter, fn)
	}
	return audit.Scan(dir, req.Filter, fn)
}

// VerifyRequest names a log to verify.
type VerifyRequest struct {
	Name string `json:"name"`
	// PublicKey, when set, is the signing key to verify against (as
	// LogKey printed it, kept elsewhere); otherwise the key pinned for
	// this state directory, else the state directory's own key.
	PublicKey string `json:"public_key,omitempty"`
}

// VerifyResult is a verification's outcome: Report.OK() says whether the
// log is intact. Warning, when set, is a weakness of the check itself
// (the key is not pinned).
type VerifyResult struct {
	Report  *audit.VerifyReport `json:"report"`
	Warning string              `json:"warning,omitempty"`
	// Key is how the signing key was checked: KeyPinned, KeyUnpinned,
	// KeyReplaced or KeyGiven.
	Key string `json:"key"`
}

// How VerifyLog checked the signing key.
const (
	KeyPinned   = "pinned"   // against the key pinned for this state directory
	KeyUnpinned = "unpinned" // the state directory's own key: nothing is pinned
	KeyReplaced = "replaced" // the state directory's key is not the pinned one (a problem)
	KeyGiven    = "given"    // against VerifyRequest.PublicKey
)

// VerifyLog checks every record hash, the chain, the Merkle tree against
// the latest signed checkpoint and its signature, and names the first bad
// record. A signing key in the state directory that is not the pinned one
// is itself a problem in the report (it was replaced).
func (s *Service) VerifyLog(ctx context.Context, req VerifyRequest) (*VerifyResult, error) {
	s.awaitDiscard(ctx, req.Name)
	dir, err := s.logDir(req.Name)
	if err != nil {
		return nil, err
	}
	res, _, err := s.verifyDir(dir, req.PublicKey, false)
	return res, err
}

// verifyDir is VerifyLog of the log in dir (a sandbox's, or a copy of one);
// with read, it also returns the records as they were verified
// (audit.VerifyRead).
func (s *Service) verifyDir(dir, publicKey string, read bool) (*VerifyResult, []audit.Record, error) {
	k, err := audit.LoadOrCreatePinnedKey(s.state.Audit())
	if err != nil {
		return nil, nil, err
	}
	res := &VerifyResult{}
	verifier := k.Verifier()
	var keyProblem string
	if publicKey != "" {
		res.Key = KeyGiven
		if verifier, err = audit.ParseVerifier(strings.TrimSpace(publicKey)); err != nil {
			return nil, nil, err
		}
	} else {
		file, pinned, err := s.pinnedKey()
		switch {
		case err != nil:
			return nil, nil, err
		case pinned == "":
			res.Key = KeyUnpinned
			res.Warning = fmt.Sprintf("the log signing key is not pinned, so a key replaced in %s would go unnoticed: run `smx logs export-key` to pin it in %s", s.state.Audit(), file)
		default:
			res.Key = KeyPinned
			if verifier, err = audit.ParseVerifier(pinned); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", file, err)
			}
			if pinned != k.PublicKey() {
				res.Key = KeyReplaced
				// Verify against the pin: checkpoints signed by the
				// replacement key then fail too, and are named.
				keyProblem = fmt.Sprintf("the signing key in %s is not the key pinned in %s: the key was replaced; checked against the pinned key", s.state.Audit(), file)
			}
		}
	}
	var (
		rep  *audit.VerifyReport
		recs []audit.Record
	)
	if read {
		rep, recs, err = audit.VerifyRead(dir, verifier)
	} else {
		rep, err = audit.Verify(dir, verifier)
	}
	if err != nil {
		return nil, nil, err
	}
	if keyProblem != "" {
		rep.Problems = append([]string{keyProblem}, rep.Problems...)
	}
	res.Report = rep
	return res, recs, nil
}

// pinnedKey returns the trusted keys file and the key it pins for this
// state directory ("" when none).
func (s *Service) pinnedKey() (file, key string, err error) {
	if file, err = audit.TrustedKeysFile(); err != nil {
		return "", "", err
	}
	key, err = audit.Pinned(file, s.state.Audit())
	return file, key, err
}

// LogKey returns the public key that signs this state directory's logs
// (created and pinned on first use).
func (s *Service) LogKey(ctx context.Context) (string, error) {
	k, err := audit.LoadOrCreatePinnedKey(s.state.Audit())
	if err != nil {
		return "", err
	}
	return k.PublicKey(), nil
}

// ExportLogKey returns the log signing key and pins it outside the state
// directory; added says whether the pin is new. A different key already
// pinned is never replaced (errdefs.ErrDenied).
func (s *Service) ExportLogKey(ctx context.Context) (key, file string, added bool, err error) {
	k, err := audit.LoadOrCreatePinnedKey(s.state.Audit())
	if err != nil {
		return "", "", false, err
	}
	file, err = audit.TrustedKeysFile()
	if err != nil {
		return "", "", false, err
	}
	added, err = audit.Pin(file, s.state.Audit(), k.PublicKey())
	if errors.Is(err, errdefs.ErrDenied) {
		return "", file, false, fmt.Errorf("the log signing key in %s is not the one pinned in %s: it was replaced, or the pin is stale; check, then edit the pin by hand: %w",
			s.state.Audit(), file, errdefs.ErrDenied)
	}
	if err != nil {
		return "", file, false, err
	}
	return k.PublicKey(), file, added, nil
}

// ListLogs returns the names of every sandbox log, removed sandboxes'
// included.
func (s *Service) ListLogs(ctx context.Context) ([]string, error) {
	names, err := audit.List(s.state.Logs())
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return names, nil
}

// PruneLogs deletes the logs of removed sandboxes; all prunes every such
// log (names must then be empty). A log whose sandbox still exists is
// refused (errdefs.ErrInUse). It returns the names pruned and the
// errors of the others, joined.
func (s *Service) PruneLogs(ctx context.Context, names []string, all bool) ([]string, error) {
	if all == (len(names) > 0) {
		return nil, fmt.Errorf("name the logs to prune, or use --all: %w", errdefs.ErrInvalid)
	}
	m := s.manager()
	if all {
		list, err := s.ListLogs(ctx)
		if err != nil {
			return nil, err
		}
		for _, n := range list {
			if _, err := m.Get(n); err == nil {
				continue // the sandbox still exists
			}
			names = append(names, n)
		}
	}
	var done []string
	var errs []error
	for _, n := range names {
		if _, err := m.Get(n); err == nil {
			errs = append(errs, fmt.Errorf("sandbox %s still exists: remove it first: %w", n, errdefs.ErrInUse))
			continue
		}
		if err := audit.Prune(s.state.Logs(), n); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, n)
	}
	return done, errors.Join(errs...)
}
