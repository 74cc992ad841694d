package cli_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	wire "github.com/smx-dev/smx/api"
)

// TestAgentRunClaudeAsk is the "done when": the real Claude Code
// CLI, driven by the scripted model, runs under a profile with
// `network.mode: ask`; its Bash tool's curl to a host no rule names stops
// on a question; the host user answers `smx approve ID --always` from
// another process; the agent carries on, the user's profile file now
// holds the rule (so the second curl is not asked about), and the log
// holds the question and the answer.
func TestAgentRunClaudeAsk(t *testing.T) {
	model := &scriptedAnthropic{steps: []string{
		"curl -sS -m 150 http://newhost.test/first; echo CURL1-RC=$?",
		"curl -sS -m 60 http://newhost.test/second; echo CURL2-RC=$?",
	}}
	w := newAgentWorld(t, "claude", "api.anthropic.com", model, false)
	prof := strings.Replace(worldProfile, "network:\n  allow:", "network:\n  mode: ask # ask for what no rule names\n  allow:", 1)
	if prof == worldProfile {
		t.Fatal("worldProfile has no network.allow to put mode: ask beside")
	}
	os.WriteFile(w.profile, []byte(prof), 0o644)
	w.login("key stored as claude", []string{"TEST_ANTHROPIC_KEY=sk-ant-api03-hostkey-ask-61d0"}, "--from-env", "TEST_ANTHROPIC_KEY")

	began := time.Now()
	out, exited := w.start("-p", "Run the steps.", "--output-format", "stream-json", "--verbose")

	// The host user, in another terminal: wait for the question about
	// newhost.test; anything else the agent reaches is denied (and named
	// on failure).
	var asked wire.Approval
	var others []string
	for asked.ID == "" {
		select {
		case err := <-exited:
			t.Fatalf("the agent ended (%v) before a question about newhost.test; others: %q\n%s", err, others, out.String())
		default:
		}
		if time.Since(began) > 8*time.Minute {
			t.Fatalf("no question about newhost.test within 8 minutes; others: %q\n%s", others, out.String())
		}
		for _, a := range w.pending(t) {
			if strings.Contains(a.What, "newhost.test") {
				asked = a
				break
			}
			others = append(others, a.What)
			w.smx("deny", a.ID)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if asked.What != "GET http://newhost.test/first" || asked.Sandbox != w.name || !strings.HasPrefix(asked.Source, w.profile+":3:") ||
		!strings.Contains(asked.Rule, "network.mode ask") {
		t.Fatalf("question %+v", asked)
	}
	select {
	case err := <-exited:
		t.Fatalf("the agent ended (%v) while its request was held\n%s", err, out.String())
	case <-time.After(2 * time.Second):
	}
	if got, err := w.smx("approve", asked.ID, "--always"); err != nil || !strings.Contains(got, "wrote network.allow: {domain: newhost.test, ports: [80]} to "+w.profile) {
		t.Fatalf("approve --always: %v\n%s", err, got)
	}
	finishedAfterAnswer(t, out, exited)
	t.Logf("agent run took %s", time.Since(began).Round(time.Second))

	// The agent carried on: both curls reached the host, the second
	// without a question.
	model.mu.Lock()
	results := strings.Join(model.toolResults, "\n")
	model.mu.Unlock()
	for _, want := range []string{"CURL1-RC=0", "CURL2-RC=0", "All steps are done."} {
		if !strings.Contains(out.String()+results, want) {
			t.Errorf("the run lacks %q", want)
		}
	}
	if n := strings.Count(results, hello); n != 2 {
		t.Errorf("the tool results hold %d answers from newhost.test, want 2: %q", n, results)
	}
	// The user's profile file holds the rule, keeps its comment, and
	// still checks.
	data, _ := os.ReadFile(w.profile)
	for _, want := range []string{"# ask for what no rule names", "added by smx approve --always", "approval " + asked.ID, "domain: newhost.test"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("%s lacks %q:\n%s", w.profile, want, data)
		}
	}
	if got, err := w.smx("profile", "check", w.profile); err != nil {
		t.Errorf("profile check after always: %v\n%s", err, got)
	}
	// The log: the question and the answer, once each.
	logs, err := w.smx("agent", "logs", w.name, "--json")
	if err != nil {
		t.Fatalf("logs: %v\n%s", err, logs)
	}
	var requested, granted int
	for _, line := range strings.Split(logs, "\n") {
		var r logRecord
		if json.Unmarshal([]byte(line), &r) != nil {
			continue
		}
		if !strings.Contains(r.f("what"), "newhost.test") {
			continue
		}
		switch r.Kind {
		case "approval.requested":
			requested++
		case "approval.granted":
			if r.f("id") == asked.ID && r.f("scope") == "always" && strings.HasPrefix(r.f("by"), "cli") &&
				strings.Contains(r.f("rule_written"), "newhost.test") && r.f("profile_file") == w.profile {
				granted++
			}
		}
	}
	if requested != 1 || granted != 1 {
		t.Errorf("the log holds %d approval.requested and %d approval.granted (always, by the CLI, with the rule) for newhost.test, want 1 and 1", requested, granted)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("other questions (denied): %q\ntranscript:\n%s\nlog:\n%s", others, out.String(), logs)
	}
}
