// Package cache keeps named package caches (~/.npm, ~/.cache/pip, ...) in
// smx's state directory, so that they outlive the sandboxes that use them.
//
// A cache is created with one of two modes, fixed for its life:
//
//   - ModeRO (the default): the guest sees the cache read-only (the file
//     gateway refuses every change) under a writable overlay of its own
//     (writes stay on the sandbox's disk). When the sandbox stops, the host
//     takes from that overlay only what it can verify: npm's
//     content-addressed entries (_cacache/content-v2/ALGO/xx/yy/rest), each
//     kept only when its bytes hash to its name (see Promote). Nothing else
//     the guest wrote reaches the cache, so one agent cannot plant a package
//     another one later runs.
//   - ModeShared: the guest reads and writes the cache directly, at once
//     visible to every sandbox using it; for one user's own agents that
//     trust each other, and for package managers whose caches the host
//     cannot verify (pip, go, cargo).
//
// Layout under caches/: NAME/cache.json (Meta) and NAME/data/ (the content,
// shared into the guest).
package cache

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/statedir"
)

// Mode says who fills a cache.
type Mode string

const (
	ModeRO     Mode = "ro"     // read-only to the guest, filled by the host with what it verified
	ModeShared Mode = "shared" // read-write to every guest that uses it
)

// DefaultMode is the mode of a cache named without one: read-only, so that
// a cache is never a way for one sandbox to reach another.
const DefaultMode = ModeRO

// Known maps the well-known cache names to their guest paths (~ is the
// guest user's home).
var Known = map[string]string{
	"npm":   "~/.npm",
	"pip":   "~/.cache/pip",
	"go":    "~/go/pkg/mod",
	"cargo": "~/.cargo/registry",
}

// Use is one cache as a sandbox uses it.
type Use struct {
	Name  string `json:"name"`
	Guest string `json:"guest"` // absolute, clean guest path (after ~ is expanded)
	Mode  Mode   `json:"mode"`
	// UID and GID own the cache in the guest (the guest user's).
	UID uint32 `json:"uid,omitempty"`
	GID uint32 `json:"gid,omitempty"`
}

// String is the use in --volume-cache notation.
func (u Use) String() string { return u.Name + ":" + u.Guest + ":" + string(u.Mode) }

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]*$`) })

// ValidName reports whether name can name a cache.
func ValidName(name string) error {
	if len(name) > 63 || !nameRE().MatchString(name) {
		return fmt.Errorf("cache: invalid name %q: use 1-63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit: %w", name, errdefs.ErrInvalid)
	}
	return nil
}

// Parse reads --volume-cache notation, NAME[:GUESTPATH][:MODE]: NAME alone
// only for a well-known name (npm, pip, go, cargo); GUESTPATH absolute or
// under ~ (home, the guest user's home); MODE ro or shared, "" when not
// given (the cache's own mode then applies, ro for a new one).
func Parse(s, home string) (Use, error) {
	bad := func(why string) (Use, error) {
		return Use{}, fmt.Errorf("--volume-cache %s: %s: %w", s, why, errdefs.ErrInvalid)
	}
	parts := strings.Split(s, ":")
	if len(parts) > 3 {
		return bad("want NAME[:GUESTPATH][:ro|shared]")
	}
	u := Use{Name: parts[0]}
	if err := ValidName(u.Name); err != nil {
		return bad("the name must be 1-63 lower-case letters, digits, '.', '_' or '-'")
	}
	guest := ""
	for _, p := range parts[1:] {
		switch {
		case p == string(ModeRO) || p == string(ModeShared):
			if u.Mode != "" {
				return bad("the mode is given twice")
			}
			u.Mode = Mode(p)
		case strings.HasPrefix(p, "/") || p == "~" || strings.HasPrefix(p, "~/"):
			if guest != "" {
				return bad("the guest path is given twice")
			}
			guest = p
		default:
			return bad("unknown part " + fmt.Sprintf("%q", p) + ": want an absolute guest path or ~/PATH, or ro or shared")
		}
	}
	if guest == "" {
		known, ok := Known[u.Name]
		if !ok {
			return bad("not a well-known cache (npm, pip, go, cargo): name its guest path, e.g. " + u.Name + ":~/.cache/" + u.Name)
		}
		guest = known
	}
	if guest == "~" || strings.HasPrefix(guest, "~/") {
		guest = home + strings.TrimPrefix(guest, "~")
	}
	if !path.IsAbs(guest) || path.Clean(guest) != guest || guest == "/" {
		return bad("the guest path must be absolute and clean, and not /")
	}
	for _, sys := range []string{"/proc", "/sys", "/dev", "/run", "/etc", "/bin", "/sbin", "/lib", "/usr", "/var/lib/smx-cache"} {
		if guest == sys || strings.HasPrefix(guest, sys+"/") {
			return bad("the guest path is under " + sys + ", which the guest system needs")
		}
	}
	u.Guest = guest
	return u, nil
}

// Meta is a cache's cache.json.
type Meta struct {
	Name    string    `json:"name"`
	Mode    Mode      `json:"mode"`
	Created time.Time `json:"created"`
}

// Info is a cache as `smx cache ls` shows it.
type Info struct {
	Meta
	Path  string `json:"path"`  // the content folder on the host
	Bytes int64  `json:"bytes"` // apparent size of the content
	Files int    `json:"files"`
}

// Store is the caches/ folder of a state directory.
type Store struct{ Dir string }

// For returns the store of state directory d.
func For(d statedir.Dir) Store { return Store{Dir: filepath.Join(d.Root, "caches")} }

// Data is the content folder of cache name.
func (s Store) Data(name string) string { return filepath.Join(s.Dir, name, "data") }

func (s Store) lock() (*statedir.Lock, error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	return statedir.LockFile(filepath.Join(s.Dir, ".lock"))
}

// Ensure makes cache u.Name with mode u.Mode (DefaultMode when "") unless it
// exists, and returns u with the cache's mode. A use whose mode differs from
// an existing cache's is refused: a read-only cache stays one.
func (s Store) Ensure(u Use) (Use, error) {
	if err := ValidName(u.Name); err != nil {
		return u, err
	}
	l, err := s.lock()
	if err != nil {
		return u, err
	}
	defer l.Unlock()
	m, err := s.meta(u.Name)
	switch {
	case err == nil:
		if u.Mode != "" && u.Mode != m.Mode {
			return u, fmt.Errorf("cache %s is %s (so it was made); use it as %s, or `smx cache rm %s` first: %w", u.Name, m.Mode, m.Mode, u.Name, errdefs.ErrInvalid)
		}
		u.Mode = m.Mode
		return u, nil
	case !errors.Is(err, errdefs.ErrNotFound):
		return u, err
	}
	if u.Mode == "" {
		u.Mode = DefaultMode
	}
	if err := os.MkdirAll(s.Data(u.Name), 0o755); err != nil {
		return u, fmt.Errorf("cache: %w", err)
	}
	b, _ := json.MarshalIndent(Meta{Name: u.Name, Mode: u.Mode, Created: time.Now().UTC()}, "", "  ")
	if err := statedir.WriteFileAtomic(filepath.Join(s.Dir, u.Name, "cache.json"), append(b, '\n'), 0o600); err != nil {
		return u, fmt.Errorf("cache: %w", err)
	}
	return u, nil
}

func (s Store) meta(name string) (Meta, error) {
	b, err := os.ReadFile(filepath.Join(s.Dir, name, "cache.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Meta{}, fmt.Errorf("cache %s: %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return Meta{}, fmt.Errorf("cache: %w", err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, fmt.Errorf("cache %s: cache.json: %w", name, err)
	}
	return m, nil
}

// Get describes cache name.
func (s Store) Get(name string) (Info, error) {
	if err := ValidName(name); err != nil {
		return Info{}, err
	}
	m, err := s.meta(name)
	if err != nil {
		return Info{}, err
	}
	in := Info{Meta: m, Path: s.Data(name)}
	filepath.WalkDir(in.Path, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				in.Bytes += fi.Size()
				in.Files++
			}
		}
		return nil
	})
	return in, nil
}

// List describes every cache, by name.
func (s Store) List() ([]Info, error) {
	ents, err := os.ReadDir(s.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	var out []Info
	for _, e := range ents {
		if !e.IsDir() || ValidName(e.Name()) != nil {
			continue
		}
		in, err := s.Get(e.Name())
		if err != nil {
			continue // half made or removed meanwhile
		}
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove deletes cache name and its content. The caller checks that no
// sandbox uses it.
func (s Store) Remove(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	l, err := s.lock()
	if err != nil {
		return err
	}
	defer l.Unlock()
	if _, err := s.meta(name); err != nil {
		return err
	}
	// Renamed away first, so that a removal cut short leaves no cache
	// that looks whole.
	gone := filepath.Join(s.Dir, ".rm-"+name+"-"+fmt.Sprint(time.Now().UnixNano()))
	if err := os.Rename(filepath.Join(s.Dir, name), gone); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	return nil
}
