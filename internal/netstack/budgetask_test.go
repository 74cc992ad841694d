package netstack

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/approval"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/usage"
)

// budgetAskRig is the usage rig with budgets that say ask, whose questions
// go to a real approval.Holder (the supervisor's), answered by the test as
// the host user would through the service.
type budgetAskRig struct {
	*usageRig
	*hostAsks
}

func newBudgetAskRig(t *testing.T, meter *usage.Meter) *budgetAskRig {
	t.Helper()
	b := &budgetAskRig{hostAsks: newHostAsks()}
	src := strings.Replace(usageProfile, "budget: {requests: 3}", "budget: {requests: 3, ask: true}", 1)
	src = strings.Replace(src, "budget: {tokens: 3000}", "budget: {tokens: 3000, ask: true}", 1)
	b.usageRig = newUsageRigProfile(t, meter, nil, src, func(c *Config) {
		c.AskBudget = func(ctx context.Context, f Flow, cred policy.Credential, what string) (bool, bool, string) {
			ans := b.holder.Ask(ctx, approval.Question{Channel: "credential", What: what, Rule: credRule(cred, budgetKey), Key: "budget " + cred.Name})
			return ans.Allow, ans.Decision == approval.Sandbox || ans.Decision == approval.Always, ans.Reason
		}
	})
	return b
}

type answered struct {
	resp *http.Response
	body []byte
}

// postAsync sends a model request as the guest without waiting for it.
func postAsync(t *testing.T, cl *http.Client, url, body string) <-chan answered {
	ch := make(chan answered, 1)
	go func() {
		req, _ := http.NewRequest("POST", url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := cl.Do(req)
		if err != nil {
			t.Error(err)
			ch <- answered{}
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ch <- answered{resp, body}
	}()
	return ch
}

func waitAnswered(t *testing.T, ch <-chan answered) answered {
	t.Helper()
	select {
	case a := <-ch:
		if a.resp == nil {
			t.Fatal("the request failed")
		}
		return a
	case <-time.After(20 * time.Second):
		t.Fatal("the held request did not finish after the answer")
	}
	return answered{}
}

// A budget that says ask holds the request past it until the host user
// answers: allowed once, that request reaches the model and the next one
// is asked about again; denied, the guest gets the provider's quota error
// naming the answer; allowed for the sandbox, the budget stops nothing
// more and nothing more is asked; unanswered within ask.timeout, the quota
// error. A held request reaches nothing upstream before the answer.
func TestBrokerBudgetAsk(t *testing.T) {
	meter, _ := usage.NewMeter("", nil)
	b := newBudgetAskRig(t, meter)
	cl := b.client(t, "anthropic.model.test")
	const url = "https://anthropic.model.test/v1/messages"
	for range 3 {
		if resp, body := post(t, cl, url, `{}`); resp.StatusCode != 200 {
			t.Fatalf("under the budget: %s %s", resp.Status, body)
		}
	}
	if n := b.count(approval.KindRequested); n != 0 {
		t.Fatalf("%d questions under the budget", n)
	}

	// Once: held, then through.
	done := postAsync(t, cl, url, `{"stream":true}`)
	q := b.question(t)
	if q.Channel != "credential" || !strings.Contains(q.What, "POST https://anthropic.model.test/v1/messages with credential claude") ||
		!strings.Contains(q.What, "credential claude has used 3 of its budget of 3 requests") || !strings.Contains(q.Rule, "credentials claude.budget") ||
		!strings.HasPrefix(q.Source, "test.yaml:") {
		t.Fatalf("question %+v", q)
	}
	select {
	case a := <-done:
		t.Fatalf("the request past the budget finished before an answer: %v", a.resp.Status)
	case <-time.After(300 * time.Millisecond):
	}
	if n := b.model.count("/v1/messages"); n != 3 {
		t.Fatalf("upstream saw %d requests while one was held, want 3", n)
	}
	if _, err := b.holder.Answer(q.ID, approval.Once, "test", nil); err != nil {
		t.Fatal(err)
	}
	if a := waitAnswered(t, done); a.resp.StatusCode != 200 || !strings.Contains(string(a.body), "message_stop") {
		t.Fatalf("allowed once: %s %s", a.resp.Status, a.body)
	}
	if n := b.model.count("/v1/messages"); n != 4 {
		t.Fatalf("upstream saw %d requests after allow once, want 4", n)
	}

	// Once is once: asked again; denied.
	done = postAsync(t, cl, url, `{}`)
	q = b.question(t)
	if _, err := b.holder.Answer(q.ID, approval.Deny, "test", nil); err != nil {
		t.Fatal(err)
	}
	a := waitAnswered(t, done)
	var ae struct {
		Type  string
		Error struct{ Type, Message string }
	}
	json.Unmarshal(a.body, &ae)
	if a.resp.StatusCode != 402 || ae.Error.Type != "billing_error" || a.resp.Header.Get("X-Should-Retry") != "false" ||
		!strings.Contains(ae.Error.Message, "credential claude has used 4 of its budget of 3 requests") ||
		!strings.Contains(ae.Error.Message, "the host user denied it") {
		t.Fatalf("denied: %s %s", a.resp.Status, a.body)
	}
	if n := b.model.count("/v1/messages"); n != 4 {
		t.Fatalf("a denied request reached upstream (%d)", n)
	}
	if e := refusedWith(b.rig, "credentials claude.budget"); !strings.Contains(e.Decision.Reason, "denied") {
		t.Errorf("refusal %+v", e.Decision)
	}

	// Sandbox: the budget is lifted; nothing more is asked.
	done = postAsync(t, cl, url, `{}`)
	q = b.question(t)
	if _, err := b.holder.Answer(q.ID, approval.Sandbox, "test", nil); err != nil {
		t.Fatal(err)
	}
	if a := waitAnswered(t, done); a.resp.StatusCode != 200 {
		t.Fatalf("allowed for the sandbox: %s %s", a.resp.Status, a.body)
	}
	for range 3 {
		if resp, body := post(t, b.client(t, "anthropic.model.test"), url, `{}`); resp.StatusCode != 200 {
			t.Fatalf("after the budget was lifted: %s %s", resp.Status, body)
		}
	}
	if n := b.count(approval.KindRequested); n != 3 {
		t.Fatalf("%d questions, want 3 (once, deny, sandbox)", n)
	}
	if n := b.model.count("/v1/messages"); n != 8 {
		t.Fatalf("upstream saw %d requests, want 8", n)
	}
	if s := meter.Spent()["claude"]; s.Requests != 8 {
		t.Fatalf("the meter counted %d requests, want 8 (every request that went)", s.Requests)
	}

	// Unanswered: a token budget's ask times out into the quota error.
	b.timeout.Store(int64(300 * time.Millisecond))
	oc := b.client(t, "openai.model.test")
	for i := range 3 {
		if resp, body := post(t, oc, "https://openai.model.test/v1/responses", `{}`); resp.StatusCode != 200 {
			t.Fatalf("under the token budget: %s %s", resp.Status, body)
		}
		b.waitUsage(t, "codex", i+1)
	}
	resp, body := post(t, oc, "https://openai.model.test/v1/responses", `{}`)
	var oe struct {
		Error struct{ Message, Code string }
	}
	json.Unmarshal(body, &oe)
	if resp.StatusCode != 429 || oe.Error.Code != "insufficient_quota" || !strings.Contains(oe.Error.Message, "no answer within ask.timeout") {
		t.Fatalf("unanswered: %s %s", resp.Status, body)
	}
	if n := b.count(approval.KindTimeout); n != 1 {
		t.Fatalf("%d approval.timeout records, want 1", n)
	}
	if n := b.model.count("/v1/responses"); n != 3 {
		t.Fatalf("upstream saw %d responses requests, want 3", n)
	}
}
