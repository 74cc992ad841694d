// Package policy holds smx security profiles: the YAML format, its
// validation, the built-in profiles and the pure evaluator that decides
// every network flow, file access, Git operation and SSH connection a
// sandbox attempts.
//
// A profile is parsed, validated and compiled once (Load, Parse, Resolve,
// Builtin); after that it is immutable and Decide is safe for concurrent use
// by any number of goroutines. Decide does no I/O, never allocates more than
// a few strings, and denies by default: every Decision names the rule that
// made it (file:line:col and the rule's place in the profile) or the
// built-in reason, so it can go straight into the audit log.
//
// Precedence, for every section: always-closed built-ins first, then deny
// rules, then allow rules, then the default (deny, or allow for network
// mode allow-all). A deny can never be overridden by a more specific allow.
package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Profile is a parsed, resolved (extends applied), validated and compiled
// security profile. Treat it as read-only: the exported fields describe the
// profile for display, and Decide uses a compiled form built by Parse, so
// changing a field afterwards does not change any decision.
type Profile struct {
	Name        string // the `name:` key, else the file name without extension, else the built-in name
	Source      string // the file path it was loaded from, or "builtin"
	Extends     string // the `extends:` reference as written ("" when none)
	Network     Network
	Files       Files
	Git         Git
	SSH         SSH
	Credentials []Credential
	Log         Log
	Ask         AskSettings
	Hash        string // "sha256:" + hex of YAML() without the name: identifies the effective policy

	c compiled
}

// Pos is where a rule was written. File is the path given to Load/Parse, or
// "builtin/NAME.yaml" for a built-in profile.
type Pos struct {
	File      string
	Line, Col int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d:%d", p.File, p.Line, p.Col) }

// ValidationError is one problem in a profile file. Load and Parse return
// all problems they find joined with errors.Join; each unwraps to
// errdefs.ErrInvalid.
type ValidationError struct {
	File      string
	Line, Col int
	Msg       string
}

func (e *ValidationError) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
}

func (e *ValidationError) Unwrap() error { return errdefs.ErrInvalid }

// ValidationErrors returns the individual validation errors inside err
// (as joined by Load or Parse), in file order; nil if there are none.
func ValidationErrors(err error) []*ValidationError {
	var out []*ValidationError
	var walk func(error)
	walk = func(err error) {
		if ve, ok := err.(*ValidationError); ok {
			out = append(out, ve)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			if e := u.Unwrap(); e != nil {
				walk(e)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// ResolveFunc returns the profile an `extends:` reference names. Parse calls
// it at most once per file.
type ResolveFunc func(ref string) (*Profile, error)

// Parse parses a profile from data. file is used in error messages and rule
// positions (and as the default name). resolve resolves an `extends:`
// reference; when nil, only built-in names may be extended. A resolve
// that loads files must reject cycles itself (Load's does).
//
// The result is fully validated: every error found is reported, as
// *ValidationError values joined with errors.Join.
func Parse(file string, data []byte, resolve ResolveFunc) (*Profile, error) {
	if resolve == nil {
		resolve = func(ref string) (*Profile, error) {
			if p, ok := Builtin(ref); ok {
				return p, nil
			}
			return nil, fmt.Errorf("%q is not a built-in profile (%s): %w", ref, strings.Join(BuiltinNames(), ", "), errdefs.ErrNotFound)
		}
	}
	return parse(file, "", data, resolve)
}

func parse(file, source string, data []byte, resolve ResolveFunc) (*Profile, error) {
	return parseAs(&decoder{file: file}, source, data, resolve)
}

// LoadFrozen reads a sandbox's frozen profile (written with FrozenYAML):
// the rules keep the positions their comments give, so decisions cite the
// file and line the user wrote them at. Its Source is the original file.
// A frozen copy extends nothing (extends was applied when it was made).
func LoadFrozen(path string) (*Profile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("policy: load %s: %w (no such file)", path, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("policy: load %s: %w: %v", path, errdefs.ErrUnavailable, err)
	}
	p, err := parseAs(&decoder{file: path, frozen: true}, path, data, func(ref string) (*Profile, error) {
		return nil, fmt.Errorf("a frozen profile extends nothing: %w", errdefs.ErrInvalid)
	})
	if err != nil {
		return nil, err
	}
	if src := frozenSource(data); src != "" {
		p.Source = src
	}
	return p, nil
}

// frozenSource is the original file named in a frozen copy's header.
func frozenSource(data []byte) string {
	first, _, _ := strings.Cut(string(data), "\n")
	_, rest, ok := strings.Cut(first, "# smx: the frozen copy of profile ")
	if !ok {
		return ""
	}
	_, src, ok := strings.Cut(rest, " (")
	if !ok || !strings.HasSuffix(src, ").") {
		return ""
	}
	return strings.TrimSuffix(src, ").")
}

func parseAs(d *decoder, source string, data []byte, resolve ResolveFunc) (*Profile, error) {
	file := d.file
	l := d.decodeFile(data)
	if d.syntax {
		return nil, errors.Join(d.errs...)
	}
	p := &Profile{Name: l.name, Source: source, Extends: l.extends}
	if p.Name == "" {
		p.Name = strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	}
	if p.Source == "" {
		p.Source = file
	}
	var base *Profile
	if l.extends != "" {
		b, err := resolve(l.extends)
		switch {
		case err == nil:
			base = b
		case len(ValidationErrors(err)) > 0:
			// Errors inside the extended file keep their own positions.
			d.errs = append(d.errs, err)
		default:
			d.errorAt(l.extendsPos, "extends %q: %v", l.extends, err)
		}
	}
	// Rules that failed to decode were dropped; what is left is still
	// checked for contradictions so that one run reports everything.
	merge(p, base, l)
	d.validate(p)
	if len(d.errs) > 0 {
		return nil, errors.Join(d.errs...)
	}
	p.c = compile(p)
	y, err := p.canonicalYAML(false)
	if err != nil {
		return nil, fmt.Errorf("policy: %s: encode: %w", file, err)
	}
	sum := sha256.Sum256(y)
	p.Hash = "sha256:" + hex.EncodeToString(sum[:])
	return p, nil
}

// errCycle marks an extends cycle.
var errCycle = errors.New("extends cycle")

// Load reads a profile file, resolves its `extends:` chain (built-in names,
// or paths relative to the extending file; cycles are rejected), validates
// and compiles it. A missing file is errdefs.ErrNotFound; problems in the
// content are *ValidationError values (errdefs.ErrInvalid) joined together.
func Load(path string) (*Profile, error) {
	return load(path, nil)
}

func load(path string, stack []string) (*Profile, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("policy: load %s: %w: %v", path, errdefs.ErrInvalid, err)
	}
	for i, s := range stack {
		if s == abs {
			chain := append(append([]string{}, stack[i:]...), abs)
			for j := range chain {
				chain[j] = filepath.Base(chain[j])
			}
			return nil, fmt.Errorf("%w: %s", errCycle, strings.Join(chain, " -> "))
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("policy: load %s: %w (no such file)", path, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("policy: load %s: %w: %v", path, errdefs.ErrUnavailable, err)
	}
	stack = append(stack, abs)
	resolve := func(ref string) (*Profile, error) {
		if p, ok := Builtin(ref); ok && !looksLikePath(ref) {
			return p, nil
		}
		if !looksLikePath(ref) {
			return nil, fmt.Errorf("%q is neither a built-in profile (%s) nor a file path ending in .yaml: %w",
				ref, strings.Join(BuiltinNames(), ", "), errdefs.ErrNotFound)
		}
		if filepath.IsAbs(ref) {
			return nil, fmt.Errorf("extends takes a path relative to this file, not %q: %w", ref, errdefs.ErrInvalid)
		}
		return load(filepath.Join(filepath.Dir(path), ref), stack)
	}
	return parse(path, path, data, resolve)
}

func looksLikePath(ref string) bool {
	return strings.ContainsRune(ref, '/') || strings.HasSuffix(ref, ".yaml") || strings.HasSuffix(ref, ".yml")
}

// Resolve returns the built-in profile called nameOrPath, or else loads the
// file at that path. An unknown name that is not a file is
// errdefs.ErrNotFound, with the built-in names in the message.
func Resolve(nameOrPath string) (*Profile, error) {
	if p, ok := Builtin(nameOrPath); ok {
		return p, nil
	}
	if !looksLikePath(nameOrPath) {
		if _, err := os.Stat(nameOrPath); err != nil {
			return nil, fmt.Errorf("policy: profile %q: %w: not a built-in (%s) and no such file",
				nameOrPath, errdefs.ErrNotFound, strings.Join(BuiltinNames(), ", "))
		}
	}
	return Load(nameOrPath)
}

// YAML returns the resolved profile (extends applied, defaults filled in)
// as YAML that Parse accepts and that yields the same Hash. It is what
// `smx profile show` prints.
func (p *Profile) YAML() ([]byte, error) {
	return p.canonicalYAML(true)
}

func (p *Profile) canonicalYAML(withName bool) ([]byte, error) {
	var buf bytes.Buffer
	if err := encodeProfile(&buf, p, withName); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
