package audit

import (
	"encoding/base64"
	"net/url"
	"strings"
	"testing"
)

func TestRedactBuiltinShapes(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"git clone https://ghp_0123456789abcdefABCDEF0123456789abcd@github.com/a/b", "git clone https://ghp_[redacted]@github.com/a/b"},
		{"GH_TOKEN=github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", "GH_TOKEN=github_pat_[redacted]"},
		{"--key=sk-ant-api03-abcdefghijklmnop_QRSTUV", "--key=sk-ant-[redacted]"},
		{"OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx", "OPENAI_API_KEY=sk-[redacted]"},
		{"aws AKIAIOSFODNN7EXAMPLE done", "aws AKIA[redacted] done"},
		{"xoxb-123456789012-abcdefghij", "xoxb-[redacted]"},
		{"Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.abc", "Authorization: Bearer [redacted]"},
		{"authorization: bearer abcdefgh12345678", "authorization: bearer [redacted]"},
		// Ordinary words that share a prefix are left alone.
		{"pip install sk-learn scikit-learn", "pip install sk-learn scikit-learn"},
		{"ghp_short task-runner AKIA bearer x", "ghp_short task-runner AKIA bearer x"},
	} {
		if got := (*Redactor)(nil).String(c.in); got != c.want {
			t.Errorf("String(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestRedactProfilePatterns(t *testing.T) {
	r, err := NewRedactor([]string{`--password[= ](\S+)`, `internal-[0-9]{6}`})
	if err != nil {
		t.Fatal(err)
	}
	got := r.Strings([]string{"mysql", "--password=hunter2", "--user", "root", "ticket internal-123456", "--password hunter3 x"})
	want := []string{"mysql", "--password=[redacted]", "--user", "root", "ticket [redacted]", "--password [redacted] x"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("Strings = %q, want %q", got, want)
	}
	// The built-in shapes apply with profile patterns too.
	if got := r.String("ghp_0123456789abcdefABCDEF0123456789abcd"); got != "ghp_[redacted]" {
		t.Errorf("built-in after profile patterns: %q", got)
	}
	if r.Strings(nil) != nil {
		t.Error("Strings(nil) != nil")
	}
	if _, err := NewRedactor([]string{"("}); err == nil {
		t.Error("a bad pattern compiled")
	}
}

func FuzzRedactNoSecretSurvives(f *testing.F) {
	f.Add("x ghp_0123456789abcdefABCDEF0123456789abcd y")
	f.Add("Bearer abcdefgh12345678")
	f.Fuzz(func(t *testing.T, s string) {
		out := (*Redactor)(nil).String(s)
		// Redacting twice changes nothing: nothing redactable is left.
		if again := (*Redactor)(nil).String(out); again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q", s, out, again)
		}
	})
}

// The values of the host's stored credentials are redacted whatever their
// shape: anywhere in an argument, percent-encoded, base64 at any offset
// (HTTP basic auth), a key file line by line; short values are left out.
func TestRedactStoredSecrets(t *testing.T) {
	const tok = "plain-Token_4f9a2c7e1b" // no built-in shape
	key := "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----\n"
	sec := NewSecrets([][]byte{[]byte(tok + "\n"), []byte("short"), []byte(key), []byte("p@ss/w+rd=Zz91")})
	r, err := NewRedactor([]string{`--password[= ](\S+)`})
	if err != nil {
		t.Fatal(err)
	}
	r = r.WithSecrets(sec)
	basic := func(user, v string) string { return base64.StdEncoding.EncodeToString([]byte(user + ":" + v)) }
	for _, c := range []struct{ in, leak string }{
		{tok, tok},
		{"Authorization: " + tok, tok},
		{"https://x:" + tok + "@git.example/a", tok},
		{"X-Key=" + tok + "&y=1", tok},
		{"curl -u me:p@ss/w+rd=Zz91 https://h", "p@ss/w+rd=Zz91"},
		{"curl 'https://h/?k=" + url.QueryEscape("p@ss/w+rd=Zz91") + "'", url.QueryEscape("p@ss/w+rd=Zz91")},
		{"echo b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ > k", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"},
	} {
		got := r.String(c.in)
		if strings.Contains(got, c.leak) || !strings.Contains(got, Redacted) {
			t.Errorf("String(%q) = %q", c.in, got)
		}
	}
	// Base64 of user:token for every length of user (each offset mod 3),
	// both alphabets: no run of the token's own characters survives.
	for _, user := range []string{"a", "ab", "abc", "x-access-token", "git"} {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			b := enc.EncodeToString([]byte(user + ":" + tok))
			got := r.String("Authorization: Basic " + b)
			if !strings.Contains(got, Redacted) || len(got)-len("Authorization: Basic ") > len(b)-len(tok)*4/3+len(Redacted)+4 {
				t.Errorf("basic %s: %q -> %q", user, b, got)
			}
		}
	}
	if got := r.String("Authorization: Basic " + basic("u", tok)); strings.Contains(got, basic("u", tok)) {
		t.Errorf("basic auth kept: %q", got)
	}
	// Short values, other words and the patterns still work as before.
	if got := r.String("grep -- '-----BEGIN OPENSSH PRIVATE KEY-----' k"); got != "grep -- '-----BEGIN OPENSSH PRIVATE KEY-----' k" {
		t.Errorf("a PEM armour line: %q", got)
	}
	if got := r.String("short shortcut --password=hunter2 ghp_0123456789abcdefABCDEF0123456789abcd"); got != "short shortcut --password=[redacted] ghp_[redacted]" {
		t.Errorf("others: %q", got)
	}
	if got := (*Redactor)(nil).WithSecrets(sec).String("x " + tok); got != "x "+Redacted {
		t.Errorf("nil redactor with secrets: %q", got)
	}
	if (*Redactor)(nil).WithSecrets(nil).String("x "+tok) != "x "+tok {
		t.Error("no secrets redacted something")
	}
}
