package policy

import (
	"strings"
	"unicode"

	"golang.org/x/text/cases"
	"golang.org/x/text/unicode/norm"
)

// foldName is the key under which a case-insensitive host file system
// compares a name (or a glob: `*`, `?` and `/` are left as they are):
// decomposed (NFD), fully case-folded (so ß is ss, as ext4's casefold
// compares it) and without format and default-ignorable code points (which
// ext4's casefold ignored before Linux 6.13, so `.e\u200dnv` was `.env`).
// Folding more than a file system does can only make more names match a
// rule; it is used beside the case-sensitive decision, never instead.
func foldName(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		return strings.ToLower(s)
	}
	s = cases.Fold().String(norm.NFD.String(s))
	s = strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) || unicode.Is(unicode.Variation_Selector, r) {
			return -1
		}
		return r
	}, s)
	return norm.NFD.String(s)
}
