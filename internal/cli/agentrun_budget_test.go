package cli_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	wire "github.com/smx-dev/smx/api"
)

// TestAgentRunClaudeBudget runs the real Claude Code CLI against the
// scripted model with a budget of 3 model requests on the preset's
// credential. The model would have the agent take 8 steps; the broker
// answers the fourth model request with Anthropic's own billing error
// (never reaching the model), the CLI shows smx's message and stops, the
// log holds one cred.usage per answered request and the refusal, and
// `agent inspect` shows the spend.
func TestAgentRunClaudeBudget(t *testing.T) {
	model, w := newBudgetWorld(t, 8, "{requests: 3}", "sk-ant-api03-hostkey-budget-77aa")

	out, err := w.run("-p", "Run the steps.", "--output-format", "stream-json", "--verbose")
	if err == nil {
		t.Errorf("the agent exited 0 past its budget")
	}
	model.mu.Lock()
	posts := countPosts(model.calls.paths)
	paths := model.calls.paths
	model.mu.Unlock()
	if posts != 3 {
		t.Errorf("the model got %d POST /v1/messages, want exactly the budget's 3: %q", posts, paths)
	}
	if !strings.Contains(out, "credential anthropic has used 3 of its budget of 3 requests in this sandbox") {
		t.Errorf("the CLI did not show smx's budget message")
	}
	if strings.Contains(out, "STEP-8-RAN") || strings.Contains(out, "All steps are done.") {
		t.Errorf("the agent went on past its budget")
	}
	logs, err := w.smx("agent", "logs", w.name, "--json")
	if err != nil {
		t.Fatalf("logs: %v\n%s", err, logs)
	}
	if n := strings.Count(logs, `"kind":"cred.usage"`); n != 3 {
		t.Errorf("%d cred.usage records, want 3", n)
	}
	for _, want := range []string{`"kind":"net.refused"`, `credentials anthropic.budget"`, `"provider":"anthropic"`,
		`"input_tokens":20`, `"output_tokens":10`, `"total_requests":3`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s", want)
		}
	}
	insp, err := w.smx("agent", "inspect", w.name)
	if err != nil || !strings.Contains(insp, "Spend:    anthropic: 3 requests, 90 tokens (in 60, out 30)") ||
		!strings.Contains(insp, "budget 3 requests per sandbox (spent") {
		t.Errorf("inspect: %v\n%s", err, insp)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("model requests: %q\ntranscript:\n%s\nlog:\n%s", paths, out, logs)
	}
}

// TestAgentRunClaudeBudgetAsk is TestAgentRunClaudeBudget with a budget
// that says ask: the fourth model request is held, not refused; the host
// user answers `smx approve ID --sandbox` from another process, which
// lifts the budget for the sandbox's life; the real CLI, which only saw
// a slow answer, carries on through all its steps without another
// question, and every request is counted.
func TestAgentRunClaudeBudgetAsk(t *testing.T) {
	model, w := newBudgetWorld(t, 5, "{requests: 3, ask: true}", "sk-ant-api03-hostkey-budgetask-3c1f")

	out, exited := w.start("-p", "Run the steps.", "--output-format", "stream-json", "--verbose")
	var asked wire.Approval
	deadline := time.Now().Add(8 * time.Minute)
	for asked.ID == "" {
		select {
		case err := <-exited:
			t.Fatalf("the agent ended (%v) without a question\n%s", err, out.String())
		case <-time.After(300 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no question within 8 minutes\n%s", out.String())
		}
		if l := w.pending(t); len(l) > 0 {
			asked = l[0]
		}
	}
	if asked.Channel != "credential" || !strings.Contains(asked.What, "POST https://api.anthropic.com/v1/messages with credential anthropic") ||
		!strings.Contains(asked.What, "used 3 of its budget of 3 requests") || !strings.Contains(asked.Rule, "credentials anthropic.budget") {
		t.Fatalf("question %+v", asked)
	}
	model.mu.Lock()
	posts := countPosts(model.calls.paths)
	model.mu.Unlock()
	if posts != 3 {
		t.Fatalf("the model got %d POST /v1/messages while the fourth was held, want 3", posts)
	}
	if got, err := w.smx("approve", asked.ID, "--sandbox"); err != nil {
		t.Fatalf("approve --sandbox: %v\n%s", err, got)
	}
	finishedAfterAnswer(t, out, exited)
	for _, want := range []string{"STEP-5-RAN", "All steps are done."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the transcript lacks %q", want)
		}
	}
	model.mu.Lock()
	posts = countPosts(model.calls.paths)
	model.mu.Unlock()
	logs, err := w.smx("agent", "logs", w.name, "--json")
	if err != nil {
		t.Fatalf("logs: %v\n%s", err, logs)
	}
	if n := strings.Count(logs, `"kind":"approval.requested"`); n != 1 {
		t.Errorf("%d questions, want 1: the answer lifted the budget", n)
	}
	if !strings.Contains(logs, `"kind":"approval.granted"`) || !strings.Contains(logs, `"scope":"sandbox"`) {
		t.Errorf("the log lacks the grant for the sandbox")
	}
	for _, line := range strings.Split(logs, "\n") {
		var r logRecord
		if json.Unmarshal([]byte(line), &r) == nil && r.Kind == "net.refused" && strings.Contains(r.f("rule"), "anthropic.budget") {
			t.Errorf("a model request was refused by the budget: %s", line)
		}
	}
	if n := strings.Count(logs, `"kind":"cred.usage"`); n != posts {
		t.Errorf("%d cred.usage records for %d model requests", n, posts)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("transcript:\n%s\nlog:\n%s", out.String(), logs)
	}
}

// newBudgetWorld is the claude world, its scripted model taking n echo
// steps, with budget (a YAML flow mapping) on the preset's credential and
// key stored as claude's.
func newBudgetWorld(t *testing.T, n int, budget, key string) (*scriptedAnthropic, *agentWorld) {
	t.Helper()
	model := &scriptedAnthropic{steps: echoSteps(n)}
	w := newAgentWorld(t, "claude", "api.anthropic.com", model, false)
	const deny = "      deny_paths: [/api/oauth/claude_cli/**, /v1/oauth/**]"
	w.overridePreset(deny, deny+"\n      budget: "+budget)
	w.login("key stored as claude", []string{"TEST_ANTHROPIC_KEY=" + key}, "--from-env", "TEST_ANTHROPIC_KEY")
	return model, w
}

func countPosts(paths []string) int {
	n := 0
	for _, p := range paths {
		if p == "POST /v1/messages" {
			n++
		}
	}
	return n
}
