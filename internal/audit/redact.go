package audit

import (
	"encoding/base64"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"
)

// Redactor removes secrets from what the log records of a command (the
// arguments of exec and run) before anything is written: a token typed
// on a command line must not land in a log that is kept and shared.
//
// Two kinds of pattern apply, in this order:
//
//   - the profile's log.redact patterns (RE2; a pattern with a group
//     replaces only the group, e.g. `--password[= ](\S+)`);
//   - built-in token shapes, always: GitHub (ghp_, gho_, ghu_, ghs_,
//     ghr_, github_pat_), Anthropic (sk-ant-), OpenAI and others (sk-),
//     AWS access key ids (AKIA...), Slack (xoxb-, xoxp-, ...) and the
//     value after "Bearer ".
//
// A match is replaced by "[redacted]", keeping a token's kind prefix
// (ghp_[redacted]) so a reader still sees what was there. A Redactor is
// immutable and safe for concurrent use.
type Redactor struct {
	rules   []redactRule
	secrets *Secrets // applied first
}

type redactRule struct {
	re   *regexp.Regexp
	keep int // bytes of the match kept as the token's kind; -1: redact group 1 only
}

// Redacted replaces each secret.
const Redacted = "[redacted]"

// builtinRedact are the token shapes redacted whatever the profile says.
// Each requires enough characters after its prefix that ordinary words
// ("sk-learn", "task-") are left alone. Compiled on first use, like the
// other patterns smx keeps: bounded repeats compile to a copy per count,
// and every smx process would otherwise pay for them at start.
var builtinRedact = sync.OnceValue(func() []redactRule {
	return []redactRule{
		{regexp.MustCompile(`\bgithub_pat_[A-Za-z0-9_]{20,}`), len("github_pat_")},
		{regexp.MustCompile(`\bgh[pousr]_[A-Za-z0-9]{20,}`), len("ghp_")},
		{regexp.MustCompile(`\bsk-ant-[A-Za-z0-9_\-]{16,}`), len("sk-ant-")},
		{regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{20,}`), len("sk-")},
		{regexp.MustCompile(`\b(?:AKIA|ASIA)[0-9A-Z]{16}\b`), len("AKIA")},
		{regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9\-]{10,}`), len("xoxb-")},
		{regexp.MustCompile(`(?i)\bbearer\s+([A-Za-z0-9_\-.~+/]{8,}=*)`), -1},
	}
})

// NewRedactor compiles the profile's patterns (policy.Log.Redact, already
// validated when the profile was parsed) after which the built-in shapes
// apply. A pattern that does not compile is an error.
func NewRedactor(patterns []string) (*Redactor, error) {
	r := &Redactor{}
	for _, p := range patterns {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, err
		}
		keep := 0
		if re.NumSubexp() > 0 {
			keep = -1
		}
		r.rules = append(r.rules, redactRule{re, keep})
	}
	r.rules = append(r.rules, builtinRedact()...)
	return r, nil
}

// WithSecrets returns r that also redacts the values in sec, before its
// patterns (a nil r: the built-in shapes). r is not changed.
func (r *Redactor) WithSecrets(sec *Secrets) *Redactor {
	q := &Redactor{rules: builtinRedact(), secrets: sec}
	if r != nil {
		q.rules = r.rules
	}
	return q
}

// String returns s with every secret replaced. A nil Redactor applies the
// built-in shapes.
func (r *Redactor) String(s string) string {
	var rules []redactRule
	if r != nil {
		rules = r.rules
		s = r.secrets.apply(s)
	} else {
		rules = builtinRedact()
	}
	for _, rule := range rules {
		s = rule.apply(s)
	}
	return s
}

// Strings redacts each element into a new slice; nil stays nil.
func (r *Redactor) Strings(ss []string) []string {
	if ss == nil {
		return nil
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = r.String(s)
	}
	return out
}

func (rule redactRule) apply(s string) string {
	if rule.keep >= 0 {
		return rule.re.ReplaceAllStringFunc(s, func(m string) string {
			return m[:min(rule.keep, len(m))] + Redacted
		})
	}
	// Replace only the first group of each match.
	idx := rule.re.FindAllStringSubmatchIndex(s, -1)
	if idx == nil {
		return s
	}
	var b []byte
	last := 0
	for _, m := range idx {
		if len(m) < 4 || m[2] < 0 {
			continue
		}
		b = append(b, s[last:m[2]]...)
		b = append(b, Redacted...)
		last = m[3]
	}
	b = append(b, s[last:]...)
	return string(b)
}

// Secrets are exact values to redact whatever their shape: the values of
// the credentials the host holds, so that one typed into a command line
// (`curl -H "Authorization: $TOKEN"`) is not logged as it is. Each value
// is found anywhere in an argument, and so are its common encodings:
// percent-encoded, and base64 (standard and URL alphabets) at any offset
// in the encoded text, as in HTTP basic auth's base64 of "user:token"; of
// a base64 form, the characters that depend on the value alone are
// replaced. A value with line breaks (a key file) is also found line by
// line, its PEM armour lines excepted. Values and lines shorter than MinSecret are left out: they would
// redact ordinary words.
//
// Secrets holds the values in memory only, in the process that writes the
// records; it is immutable and safe for concurrent use.
type Secrets struct {
	forms []string // longest first, so a value goes before a part of it
}

// MinSecret is the shortest value Secrets redacts.
const MinSecret = 8

// NewSecrets compiles values. Surrounding white space of each value is
// ignored (stored values often end in a newline).
func NewSecrets(values [][]byte) *Secrets {
	seen := map[string]bool{}
	var forms []string
	add := func(f string) {
		if len(f) >= MinSecret && !seen[f] {
			seen[f] = true
			forms = append(forms, f)
		}
	}
	addValue := func(v string, encoded bool) {
		if len(v) < MinSecret {
			return
		}
		add(v)
		if !encoded {
			return
		}
		add(url.QueryEscape(v))
		add(url.PathEscape(v))
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			for k := range 3 {
				add(base64Core(enc, v, k))
			}
		}
	}
	for _, b := range values {
		v := strings.TrimSpace(string(b))
		addValue(v, true)
		if strings.ContainsAny(v, "\r\n") {
			for _, line := range strings.FieldsFunc(v, func(r rune) bool { return r == '\r' || r == '\n' }) {
				// A PEM armour line names the kind of key; it is no secret.
				if line = strings.TrimSpace(line); !strings.HasPrefix(line, "-----") {
					addValue(line, false)
				}
			}
		}
	}
	sort.SliceStable(forms, func(i, j int) bool { return len(forms[i]) > len(forms[j]) })
	return &Secrets{forms: forms}
}

// base64Core is the part of the base64 encoding of v, preceded by k other
// bytes, that v alone decides: the encoding of "user:" + v shifts v by
// len("user:") mod 3 bytes, and every character that mixes v's bits with
// its neighbours' is left out.
func base64Core(enc *base64.Encoding, v string, k int) string {
	src := make([]byte, k+len(v))
	copy(src[k:], v)
	s := enc.EncodeToString(src)
	start, end := (8*k+5)/6, 8*(k+len(v))/6
	if start >= end {
		return ""
	}
	return s[start:end]
}

// Len is how many forms are redacted (for tests and logs; never the values).
func (sec *Secrets) Len() int {
	if sec == nil {
		return 0
	}
	return len(sec.forms)
}

func (sec *Secrets) apply(s string) string {
	if sec == nil {
		return s
	}
	for _, f := range sec.forms {
		if strings.Contains(s, f) {
			s = strings.ReplaceAll(s, f, Redacted)
		}
	}
	return s
}
