package cli_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestAgentRunClaudeBudget runs the real Claude Code CLI against the
// scripted model with a budget of 3 model requests on the preset's
// credential. The model would have the agent take 8 steps; the broker
// answers the fourth model request with Anthropic's own billing error
// (never reaching the model), the CLI shows smx's message and stops, the
// log holds one cred.usage per answered request and the refusal, and
// `agent inspect` shows the spend.
func TestAgentRunClaudeBudget(t *testing.T) {
	var steps []string
	for i := 1; i <= 8; i++ {
		steps = append(steps, fmt.Sprintf("echo STEP-%d-RAN", i))
	}
	model := &scriptedAnthropic{steps: steps}
	w := newAgentWorld(t, "claude", "api.anthropic.com", model, false)
	const deny = "      deny_paths: [/api/oauth/claude_cli/**, /v1/oauth/**]"
	w.overridePreset(deny, deny+"\n      budget: {requests: 3}")
	w.login("key stored as claude", []string{"TEST_ANTHROPIC_KEY=sk-ant-api03-hostkey-budget-77aa"}, "--from-env", "TEST_ANTHROPIC_KEY")

	out, err := w.run("-p", "Run the steps.", "--output-format", "stream-json", "--verbose")
	if err == nil {
		t.Errorf("the agent exited 0 past its budget")
	}
	model.mu.Lock()
	var posts int
	for _, p := range model.calls.paths {
		if p == "POST /v1/messages" {
			posts++
		}
	}
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
