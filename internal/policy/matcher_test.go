package policy

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// Each check accepts exactly what its bounded pattern (the form the
// rules are written in) accepts, lengths at and past the bounds included.
func TestMatchersAsBoundedPatterns(t *testing.T) {
	for _, c := range []struct {
		check   func(string) bool
		pattern string
	}{
		{validName, `^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`},
		{validEnvGlob, `^[A-Za-z_*?][A-Za-z0-9_*?]{0,63}$`},
		{validHostKey, `^SHA256:[A-Za-z0-9+/]{43}$`},
		{validUserGlob, `^[A-Za-z0-9._*?-]{1,64}$`},
		{validSecretName, `^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$`},
		{validMethod, `^[A-Za-z]{1,16}$`},
		{validHeader, "^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$"},
		{validOptionGlob, `^[A-Za-z0-9_*][A-Za-z0-9._*-]{0,63}$`},
	} {
		re := regexp.MustCompile(c.pattern)
		r := rand.New(rand.NewPCG(1, 2))
		alphabet := []byte("aZ09._-/*?+!#$%&'^`|~ :\x00é")
		for i := 0; i < 20000; i++ {
			n := r.IntN(140)
			var b strings.Builder
			if r.IntN(3) == 0 {
				b.WriteString("SHA256:")
			}
			for b.Len() < n {
				b.WriteByte(alphabet[r.IntN(len(alphabet))])
			}
			s := b.String()
			if got, want := c.check(s), re.MatchString(s); got != want {
				t.Fatalf("%s: %q (%d bytes): check says %v, pattern %v", c.pattern, s, len(s), got, want)
			}
		}
		// Exactly at and one past the upper bound, of an accepted shape.
		for _, n := range []int{1, 16, 17, 50, 64, 65, 128, 129} {
			s := strings.Repeat("a", n)
			if got, want := c.check(s), re.MatchString(s); got != want {
				t.Fatalf("%s: %d x 'a': check says %v, pattern %v", c.pattern, n, got, want)
			}
		}
	}
}
