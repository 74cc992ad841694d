package cli

import (
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/usage"
)

// inspect's Spend line says what happens past a budget: refused, or asked.
func TestSpendTextBudgetAsk(t *testing.T) {
	spent := usage.Spent{Requests: 3}
	for _, tc := range []struct {
		b    service.Budget
		used usage.Spent
		want string
	}{
		{service.Budget{Requests: 3, Per: "sandbox"}, spent, "budget 3 requests per sandbox (spent: model requests are refused)"},
		{service.Budget{Requests: 3, Per: "sandbox", Ask: true}, spent, "budget 3 requests per sandbox (spent: model requests are asked of the host user)"},
		{service.Budget{Requests: 5, Per: "sandbox", Ask: true}, spent, "budget 5 requests per sandbox, asks when spent"},
	} {
		b := tc.b
		if got := spendText(service.CredentialUsage{Credential: "c", Spent: tc.used, Budget: &b}); !strings.HasSuffix(got, tc.want) {
			t.Errorf("%+v: %q, want … %q", tc.b, got, tc.want)
		}
	}
}
