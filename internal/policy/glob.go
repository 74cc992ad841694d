package policy

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Globs over slash-separated names (guest paths, repos, refs): `*` matches
// any run of characters within one element, `?` one character, and `**` as
// a whole element matches any number of elements, including none. There
// are no character classes or braces.

const maxDoubleStars = 4 // bounds the backtracking of matchSegments

// checkGlob validates a slash-separated glob. Paths (abs) start with "/";
// repos and refs do not.
func checkGlob(p string, abs bool) error {
	if abs {
		if !strings.HasPrefix(p, "/") {
			return errors.New("must be an absolute guest path")
		}
		if p == "/" {
			return nil
		}
		p = p[1:]
	} else if p == "" || strings.HasPrefix(p, "/") {
		return errors.New("must not be empty or start with /")
	}
	stars := 0
	for _, el := range strings.Split(p, "/") {
		switch {
		case el == "":
			return errors.New("empty element (// or a trailing /)")
		case el == "." || el == "..":
			return fmt.Errorf("%q elements are not allowed", el)
		case el == "**":
			stars++
		case strings.Contains(el, "**"):
			return errors.New("** must be a whole element, as in /work/**/secret")
		}
		for _, r := range el {
			switch {
			case r == '[' || r == ']' || r == '{' || r == '}' || r == '\\':
				return fmt.Errorf("unsupported glob character %q (only * ? and ** are special)", r)
			case r < 0x20 || r == 0x7f || r == utf8.RuneError:
				return errors.New("control or invalid characters")
			}
		}
	}
	if stars > maxDoubleStars {
		return fmt.Errorf("more than %d ** elements", maxDoubleStars)
	}
	return nil
}

// checkHostGlob validates an SSH host glob: host-name characters plus * and ?.
func checkHostGlob(s string) error {
	if s == "" || len(s) > 253 {
		return errors.New("must be 1 to 253 characters")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == '*', c == '?', c == ':':
		default:
			return errors.New("use host-name characters and the globs * ?")
		}
	}
	return nil
}

// splitGlob splits a validated glob into elements ("" for "/").
func splitGlob(p string) []string {
	p = strings.TrimPrefix(p, "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// globWeight orders globs by specificity: more literal characters first,
// then fewer wildcards.
func globWeight(p string) (literal, wild int) {
	for _, el := range splitGlob(p) {
		if el == "**" {
			wild += 2
			continue
		}
		for i := 0; i < len(el); i++ {
			if el[i] == '*' || el[i] == '?' {
				wild++
			} else {
				literal++
			}
		}
		literal++ // the separator
	}
	return literal, wild
}

// matchSegments reports whether s (slash-separated, no leading slash; ""
// has no elements) matches the pattern elements. Like matchElement it
// backtracks only to the last `**`, which is enough (a later ** can absorb
// whatever an earlier one would have), so it runs in O(len(pat)*len(s))
// however many ** a pattern has and whatever path the guest sends. It does
// not allocate.
func matchSegments(pat []string, s string) bool {
	end := len(s) + 1 // s[si:] is the rest while si < end; si == end: no elements left
	si := 0
	if s == "" {
		si = end
	}
	next := func(i int) int { // start of the element after the one at i
		if j := strings.IndexByte(s[i:], '/'); j >= 0 {
			return i + j + 1
		}
		return end
	}
	pi, starP, starS := 0, -1, 0
	for pi < len(pat) || si < end {
		if pi < len(pat) {
			if pat[pi] == "**" {
				starP, starS = pi, si
				pi++
				continue
			}
			if si < end {
				n := next(si)
				el := s[si : n-1]
				if n == end {
					el = s[si:]
				}
				if matchElement(pat[pi], el) {
					pi, si = pi+1, n
					continue
				}
			}
		}
		if starP >= 0 && starS < end {
			starS = next(starS)
			pi, si = starP+1, starS
			continue
		}
		return false
	}
	return true
}

// matchElement matches one element against a pattern with `*` and `?`
// (neither crosses "/", which the caller never passes). Linear-time
// backtracking over the last star.
func matchElement(p, s string) bool {
	px, sx := 0, 0
	starP, starS := -1, 0
	for px < len(p) || sx < len(s) {
		if px < len(p) {
			switch c := p[px]; c {
			case '*':
				starP, starS = px, sx
				px++
				continue
			case '?':
				if sx < len(s) {
					_, n := utf8.DecodeRuneInString(s[sx:])
					px++
					sx += n
					continue
				}
			default:
				if sx < len(s) && s[sx] == c {
					px++
					sx++
					continue
				}
			}
		}
		if starP >= 0 && starS < len(s) {
			_, n := utf8.DecodeRuneInString(s[starS:])
			starS += n
			px, sx = starP+1, starS
			continue
		}
		return false
	}
	return true
}
