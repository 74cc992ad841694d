package service

import (
	"os"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/usage"
)

// UsageOf lists every credential the broker counted and every budgeted
// one (at zero), with its budget; a day's counts from another UTC day
// read as zero.
func TestUsageOf(t *testing.T) {
	dir := t.TempDir()
	prof, err := policy.Parse("p.yaml", []byte(`credentials:
  - name: claude
    from: k
    domain: api.anthropic.com
    header: x-api-key
    budget: {tokens: 1000, per: day}
  - name: openai
    from: k2
    domain: api.openai.com
    header: Authorization
    budget: {requests: 9}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	fy, _ := prof.FrozenYAML()
	os.WriteFile(sandbox.Paths{Dir: dir}.Profile(), fy, 0o600)
	yesterday := time.Now().Add(-24 * time.Hour)
	m, _ := usage.NewMeter(usage.File(dir), func() time.Time { return yesterday })
	m.Admit("claude", nil, true)
	m.Add("claude", usage.Tokens{Input: 700, Output: 50}, true)
	m.Add("gemini", usage.Tokens{Input: 5}, false)
	m.Close()

	got := UsageOf(sandbox.Info{Dir: dir})
	if len(got) != 3 || got[0].Credential != "claude" || got[1].Credential != "gemini" || got[2].Credential != "openai" {
		t.Fatalf("UsageOf = %+v", got)
	}
	c := got[0]
	if c.Requests != 1 || c.Total() != 750 || c.DayTokens != 0 || c.Day != time.Now().UTC().Format(time.DateOnly) ||
		c.Budget == nil || *c.Budget != (Budget{Tokens: 1000, Per: "day"}) {
		t.Errorf("claude %+v budget %+v", c, c.Budget)
	}
	if o := got[2]; o.Requests != 0 || o.Budget == nil || o.Budget.Requests != 9 || o.Budget.Per != "sandbox" {
		t.Errorf("openai %+v", o)
	}
	if got[1].Budget != nil || got[1].Requests != 1 {
		t.Errorf("gemini %+v", got[1])
	}
	if UsageOf(sandbox.Info{Dir: t.TempDir()}) != nil {
		t.Error("a sandbox with no credentials has usage")
	}
}
