package policy

import (
	"strings"
	"testing"
)

func TestLogRedact(t *testing.T) {
	p := mustParse(t, "l.yaml", "log:\n  redact:\n    - '--password[= ](\\S+)'\n    - 'internal-[0-9]+'\n")
	if len(p.Log.Redact) != 2 || p.Log.Redact[0].Pattern != `--password[= ](\S+)` || p.Log.Redact[1].Pos.Line != 4 {
		t.Fatalf("Log = %+v", p.Log)
	}
	// It survives the frozen (canonical) form, and extends appends.
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	q := mustParse(t, "frozen.yaml", string(y))
	if len(q.Log.Redact) != 2 || q.Hash != p.Hash {
		t.Fatalf("frozen: %+v, hash %s vs %s", q.Log, q.Hash, p.Hash)
	}
	if plain := mustParse(t, "n.yaml", "network:\n  mode: deny-all\n"); strings.Contains(mustYAML(t, plain), "log:") {
		t.Errorf("a profile without log: gained one")
	}
	for src, want := range map[string]string{
		"log:\n  redact:\n    - '('\n":      "l.yaml:3:7: log.redact[0]: error parsing regexp",
		"log:\n  redact:\n    - '(a)(b)'\n": "at most one group",
		"log:\n  redact:\n    - 'x*'\n":     "matches the empty string",
		"log:\n  redcat: []\n":              `unknown key "redcat" in log`,
	} {
		_, err := Parse("l.yaml", []byte(src), nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want %q", src, err, want)
		}
	}
}

func mustYAML(t *testing.T, p *Profile) string {
	y, err := p.YAML()
	if err != nil {
		t.Fatal(err)
	}
	return string(y)
}
