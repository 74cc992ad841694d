// Package creds is the host-side credential store: Git tokens, SSH keys,
// model API keys. Values live only here, one file per credential, 0600 in a
// 0700 directory under the state directory (STATE/creds). The gateways read
// them to act for the agent; nothing in this package hands a value to a
// guest, prints it, or logs it. List describes credentials by name, size,
// time and a short hash prefix, so versions can be told apart without
// showing the value.
//
// Concurrency: Set replaces a value atomically (temp file, fsync, rename), so
// a concurrent Get sees the old value or the new one, never a mix. Two Sets
// of one name race; the last rename wins.
package creds

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/statedir"
)

// MaxValue bounds a credential's size; tokens and keys are far smaller.
const MaxValue = 1 << 20

// Store is a credential directory.
type Store struct{ Dir string }

// Info describes a credential without its value.
type Info struct {
	Name         string
	Updated      time.Time
	Bytes        int
	SHA256Prefix string // first 8 hex digits of the value's SHA-256: tells versions apart, reveals nothing useful
}

// The length is checked apart: a bounded repeat ({1,64}) compiles to a
// copy per count, which every smx process would pay for when it first
// checks a name.
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_.-]+$`) })

// ValidName checks a credential name: 1-64 of [A-Za-z0-9_.-], not starting
// with a dot (dot files are the store's temporaries; "." and ".." are not
// names).
func ValidName(name string) error {
	if len(name) > 64 || !nameRE().MatchString(name) || strings.HasPrefix(name, ".") {
		return fmt.Errorf("creds: invalid name %q: use 1-64 letters, digits, '_', '.' or '-', not starting with '.': %w", name, errdefs.ErrInvalid)
	}
	return nil
}

func (s Store) path(name string) string { return filepath.Join(s.Dir, name) }

// ensureDir creates the store directory 0700, and tightens an existing one
// that is more open.
func (s Store) ensureDir() error {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	st, err := os.Stat(s.Dir)
	if err != nil {
		return err
	}
	if st.Mode().Perm() != 0o700 {
		return os.Chmod(s.Dir, 0o700)
	}
	return nil
}

// Set stores value under name, replacing any previous value.
func (s Store) Set(name string, value []byte) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if len(value) == 0 {
		return fmt.Errorf("creds: set %s: empty value: %w", name, errdefs.ErrInvalid)
	}
	if len(value) > MaxValue {
		return fmt.Errorf("creds: set %s: value is %d bytes, the limit is %d: %w", name, len(value), MaxValue, errdefs.ErrInvalid)
	}
	if err := s.ensureDir(); err != nil {
		return fmt.Errorf("creds: set %s: %w", name, err)
	}
	if err := statedir.WriteFileAtomic(s.path(name), value, 0o600); err != nil {
		return fmt.Errorf("creds: set %s: %w", name, err)
	}
	return nil
}

// Get returns the value of name. It refuses a file that others can read or
// write (as ssh does with keys): something outside smx changed it.
func (s Store) Get(name string) ([]byte, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	f, err := os.Open(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("creds: %s: no such credential; add it with `smx creds set %s`: %w", name, name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("creds: get %s: %w", name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("creds: get %s: %w", name, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("creds: get %s: not a regular file: %w", name, errdefs.ErrInvalid)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("creds: get %s: %s has mode %#o, readable by others; chmod 600 it or set it again: %w",
			name, s.path(name), st.Mode().Perm(), errdefs.ErrDenied)
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && len(b) > 0 {
		return nil, fmt.Errorf("creds: get %s: %w", name, err)
	}
	return b, nil
}

// List describes every credential, sorted by name. A missing store is empty.
func (s Store) List() ([]Info, error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("creds: list: %w", err)
	}
	var out []Info
	for _, e := range ents {
		if ValidName(e.Name()) != nil || !e.Type().IsRegular() {
			continue
		}
		st, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		v, err := os.ReadFile(s.path(e.Name()))
		if err != nil {
			continue
		}
		sum := sha256.Sum256(v)
		n := len(v)
		clear(v)
		out = append(out, Info{Name: e.Name(), Updated: st.ModTime(), Bytes: n, SHA256Prefix: hex.EncodeToString(sum[:4])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove deletes name.
func (s Store) Remove(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	err := os.Remove(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("creds: rm %s: no such credential: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("creds: rm %s: %w", name, err)
	}
	return nil
}
