package audit

import (
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
