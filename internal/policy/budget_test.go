package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A credential's budget is read, written into the frozen copy the
// supervisor enforces, and refused with file:line when malformed.
func TestCredentialBudget(t *testing.T) {
	p, err := Parse("b.yaml", []byte(`credentials:
  - name: anthropic
    from: anthropic-key
    domain: api.anthropic.com
    header: x-api-key
    budget: {tokens: 2_000_000, requests: 500, per: day}
  - name: openai
    from: openai-key
    domain: api.openai.com
    header: Authorization
    budget:
      requests: 3
      ask: true
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, o := p.Credentials[0].Budget, p.Credentials[1].Budget
	if a == nil || a.Tokens != 2000000 || a.Requests != 500 || a.Per != BudgetPerDay || a.Pos.Line != 6 {
		t.Fatalf("anthropic budget = %+v", a)
	}
	if o == nil || o.Tokens != 0 || o.Requests != 3 || o.Per != BudgetPerSandbox || !o.Ask || a.Ask {
		t.Fatalf("openai budget = %+v (per defaults to sandbox; ask as written)", o)
	}
	fy, err := p.FrozenYAML()
	if err != nil {
		t.Fatal(err)
	}
	frozen := filepath.Join(t.TempDir(), "sandboxes", "s", "profile.yaml")
	os.MkdirAll(filepath.Dir(frozen), 0o755)
	os.WriteFile(frozen, fy, 0o600)
	fz, err := LoadFrozen(frozen)
	if err != nil || fz.Hash != p.Hash || fz.Credentials[0].Budget == nil || *fz.Credentials[0].Budget != (Budget{Tokens: 2000000, Requests: 500, Per: BudgetPerDay, Pos: fz.Credentials[0].Budget.Pos}) {
		t.Fatalf("frozen: %v\n%s", err, fy)
	}
	if !fz.Credentials[1].Budget.Ask {
		t.Fatalf("the frozen copy lost the budget's ask:\n%s", fy)
	}
	noBudget, _ := Parse("n.yaml", []byte("credentials:\n  - name: x\n    from: s\n    domain: a.example\n    header: X\n"), nil)
	if noBudget.Hash == p.Hash || noBudget.Credentials[0].Budget != nil {
		t.Fatal("a binding without budget has none")
	}
	for bad, want := range map[string]string{
		"budget: {tokens: 0}":             "positive whole number",
		"budget: {tokens: -5}":            "positive whole number",
		"budget: {requests: lots}":        "positive whole number",
		"budget: {tokens: 10, per: week}": "want sandbox",
		"budget: {per: day}":              "give tokens, requests or both",
		"budget: {tokens: 1, dollars: 5}": "unknown key \"dollars\"",
		"budget: 100":                     "want a mapping",
		"budget: {tokens: [1]}":           "want a single value",
		"budget: {tokens: 1, ask: maybe}": "is not allow or deny",
	} {
		y := "credentials:\n  - name: x\n    from: s\n    domain: a.example\n    header: X\n    " + bad + "\n"
		if _, err := Parse("bad.yaml", []byte(y), nil); err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "bad.yaml:6:") {
			t.Errorf("%s: err = %v, want bad.yaml:6: ... %s", bad, err, want)
		}
	}
	if _, err := Parse("bad.yaml", []byte("credentials:\n  - name: x\n    from: s\n    forge: github.com\n    budget: {requests: 1}\n"), nil); err == nil || !strings.Contains(err.Error(), "goes with domain") {
		t.Errorf("forge budget: %v", err)
	}
}
