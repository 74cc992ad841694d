package service

import (
	"time"

	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/usage"
)

// CredentialUsage is what the guest has spent through one model
// credential: the totals the sandbox's credential broker keeps
// (usage.json in its directory) and the binding's budget, if any.
type CredentialUsage struct {
	Credential string `json:"credential"`
	usage.Spent
	Budget *Budget `json:"budget,omitempty"`
}

// Budget is a credential binding's budget as the profile states it.
type Budget struct {
	Tokens   int64  `json:"tokens,omitempty"`
	Requests int64  `json:"requests,omitempty"`
	Per      string `json:"per"`
	Ask      bool   `json:"ask,omitempty"` // past it, the host user is asked
}

// UsageOf reads a sandbox's spend by credential, sorted by name: every
// credential with a count, and every budgeted one of its frozen profile
// (at zero until used). A day's counts from an earlier UTC day read as 0.
func UsageOf(in sandbox.Info) []CredentialUsage {
	if in.Dir == "" {
		return nil
	}
	spent, _ := usage.Load(usage.File(in.Dir))
	budgets := map[string]*Budget{}
	if prof, err := policy.LoadFrozen(sandbox.Paths{Dir: in.Dir}.Profile()); err == nil {
		for _, c := range prof.Credentials {
			if b := c.Budget; b != nil {
				budgets[c.Name] = &Budget{Tokens: b.Tokens, Requests: b.Requests, Per: b.Per, Ask: b.Ask}
				if _, ok := spent[c.Name]; !ok {
					if spent == nil {
						spent = map[string]usage.Spent{}
					}
					spent[c.Name] = usage.Spent{}
				}
			}
		}
	}
	today := time.Now().UTC().Format(time.DateOnly)
	var out []CredentialUsage
	for _, name := range usage.Names(spent) {
		s := spent[name]
		if s.Day != today {
			s.Day, s.DayRequests, s.DayTokens = today, 0, 0
		}
		out = append(out, CredentialUsage{Credential: name, Spent: s, Budget: budgets[name]})
	}
	return out
}
