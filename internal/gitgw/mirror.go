package gitgw

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Fast-forward is decided on the forge's history, not on the client's
// word: the gateway keeps a bare mirror per repository (under
// Mirrors.Dir, on the host), brings its branches and tags up to date from
// the forge with the forge credential (Fetcher), indexes the pushed pack
// into a fresh quarantine object directory whose alternate is the mirror,
// and asks `git merge-base --is-ancestor OLD NEW` there. The quarantine is
// removed afterwards; nothing of a push enters the mirror except by a
// later fetch from the forge. The mirror only ever holds what the forge
// serves to the credential.
//
// The upstream still checks OLD against the ref's value when it applies
// the update (receive-pack's ref transaction), so a client that claims a
// stale OLD is refused by the forge, not let through.

// Fetcher brings the forge's refs/heads/* and refs/tags/* of one
// repository into the bare repository gitDir (git fetch with the host-held
// credential, through whatever transport the gateway uses).
type Fetcher func(ctx context.Context, git, gitDir string) error

// Mirrors is a host-side cache of bare mirrors, one per repository
// identity. Safe for concurrent use: one push per repository at a time
// works on a mirror.
type Mirrors struct {
	Dir string // created on first use
	Git string // the git binary; "" means "git" on PATH

	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (m *Mirrors) git() string {
	if m.Git == "" {
		return "git"
	}
	return m.Git
}

func (m *Mirrors) lock(repo string) func() {
	m.mu.Lock()
	if m.locks == nil {
		m.locks = map[string]*sync.Mutex{}
	}
	l := m.locks[repo]
	if l == nil {
		l = &sync.Mutex{}
		m.locks[repo] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// Quarantine is an Ancestry over a repository's mirror plus one push's
// objects. Close removes the quarantine and releases the mirror.
type Quarantine struct {
	m       *Mirrors
	mirror  string
	objects string
	unlock  func()
}

// Open updates repo's mirror with fetch and indexes pack (the push's
// packfile; nil or empty for none) into a new quarantine.
func (m *Mirrors) Open(ctx context.Context, repo string, fetch Fetcher, pack io.Reader) (*Quarantine, error) {
	sum := sha256.Sum256([]byte(repo))
	mirror := filepath.Join(m.Dir, hex.EncodeToString(sum[:12])+".git")
	unlock := m.lock(repo)
	q := &Quarantine{m: m, mirror: mirror, unlock: unlock}
	if err := m.ensure(ctx, mirror, repo); err != nil {
		q.Close()
		return nil, err
	}
	if err := fetch(ctx, m.git(), mirror); err != nil {
		q.Close()
		return nil, fmt.Errorf("update the mirror from the forge: %w", err)
	}
	dir, err := os.MkdirTemp(mirror, "quarantine-")
	if err != nil {
		q.Close()
		return nil, err
	}
	q.objects = dir
	if pack != nil {
		var errb bytes.Buffer
		cmd := q.cmd(ctx, "index-pack", "--stdin", "--fix-thin")
		cmd.Stdin, cmd.Stderr = pack, &errb
		if err := os.MkdirAll(filepath.Join(dir, "pack"), 0o700); err != nil {
			q.Close()
			return nil, err
		}
		if err := cmd.Run(); err != nil {
			q.Close()
			return nil, fmt.Errorf("index the pushed pack: %v: %s", err, lastLine(errb.String()))
		}
	}
	return q, nil
}

func (m *Mirrors) ensure(ctx context.Context, mirror, repo string) error {
	if _, err := os.Stat(filepath.Join(mirror, "HEAD")); err == nil {
		return nil
	}
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(m.Dir, ".init-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var errb bytes.Buffer
	cmd := exec.CommandContext(ctx, m.git(), "init", "--bare", "--quiet", tmp)
	cmd.Env, cmd.Stderr = gitEnv(), &errb
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("git init: %v: %s", err, lastLine(errb.String()))
	}
	os.WriteFile(filepath.Join(tmp, "description"), []byte("smx mirror of "+repo+"\n"), 0o600)
	if err := os.Rename(tmp, mirror); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

func (q *Quarantine) cmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, q.m.git(), args...)
	cmd.Dir = q.mirror
	cmd.Env = append(gitEnv(), "GIT_DIR="+q.mirror, "GIT_OBJECT_DIRECTORY="+q.objects,
		"GIT_ALTERNATE_OBJECT_DIRECTORIES="+filepath.Join(q.mirror, "objects"))
	return cmd
}

// IsAncestor implements Ancestry with git merge-base --is-ancestor.
func (q *Quarantine) IsAncestor(ctx context.Context, old, new string) (bool, error) {
	if !isOID(old) || !isOID(new) {
		return false, errors.New("bad object id")
	}
	var errb bytes.Buffer
	cmd := q.cmd(ctx, "merge-base", "--is-ancestor", old, new)
	cmd.Stderr = &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ee) && ee.ExitCode() == 1:
		return false, nil
	}
	return false, fmt.Errorf("git merge-base: %v: %s", err, lastLine(errb.String()))
}

// Close removes the quarantine and unlocks the mirror. Idempotent.
func (q *Quarantine) Close() error {
	if q.objects != "" {
		os.RemoveAll(q.objects)
		q.objects = ""
	}
	if q.unlock != nil {
		q.unlock()
		q.unlock = nil
	}
	return nil
}

// gitEnv is a clean environment for host git: no user or system config,
// no prompts, no hooks of the invoking user.
func gitEnv() []string {
	env := []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0", "HOME=/nonexistent", "LC_ALL=C"}
	if p := os.Getenv("PATH"); p != "" {
		env = append(env, "PATH="+p)
	}
	return env
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return truncate(s, 300)
}
