package cli_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// scriptedAnthropic is test code: a scripted model server speaking enough
// of the Anthropic Messages API (streaming and not) to drive the real
// Claude Code CLI through tool calls. Each agent-loop request (one that
// offers tools) gets the step numbered by the tool results the
// conversation holds so far; other requests (titles, quota checks) get a
// short text.
type scriptedAnthropic struct {
	steps []string // Bash commands, one per step; then a closing text

	mu          sync.Mutex
	calls       modelCalls // x-api-key of every request, or its Authorization when it has none
	toolResults []string   // text of every tool result the agent sent back
}

func (m *scriptedAnthropic) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	k := r.Header.Get("x-api-key")
	if k == "" {
		k = r.Header.Get("Authorization")
	}
	m.calls.keys = append(m.calls.keys, k)
	m.calls.paths = append(m.calls.paths, r.Method+" "+r.URL.Path)
	m.mu.Unlock()
	if r.URL.Path == "/v1/messages/count_tokens" {
		fmt.Fprint(w, `{"input_tokens": 12}`)
		return
	}
	if r.URL.Path != "/v1/messages" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Tools    []any  `json:"tools"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	results := 0
	var texts []string
	for _, msg := range req.Messages {
		var blocks []struct {
			Type    string          `json:"type"`
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(msg.Content, &blocks) != nil {
			continue
		}
		for _, b := range blocks {
			if b.Type == "tool_result" {
				results++
				texts = append(texts, string(b.Content))
			}
		}
	}
	var blocks []map[string]any
	stop := "end_turn"
	switch {
	case len(req.Tools) == 0:
		blocks = []map[string]any{{"type": "text", "text": "Sandbox task"}}
	case results < len(m.steps):
		stop = "tool_use"
		blocks = []map[string]any{
			{"type": "text", "text": fmt.Sprintf("Step %d.", results+1)},
			{"type": "tool_use", "id": fmt.Sprintf("toolu_smx_%d", results+1), "name": "Bash",
				"input": map[string]any{"command": m.steps[results], "description": fmt.Sprintf("step %d", results+1)}},
		}
	default:
		m.mu.Lock()
		m.toolResults = texts
		m.mu.Unlock()
		blocks = []map[string]any{{"type": "text", "text": "All steps are done."}}
	}
	usage := map[string]any{"input_tokens": 20, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
	msg := map[string]any{"id": fmt.Sprintf("msg_smx_%d", time.Now().UnixNano()), "type": "message", "role": "assistant",
		"model": req.Model, "content": blocks, "stop_reason": stop, "stop_sequence": nil, "usage": usage}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(msg)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	fl, _ := w.(http.Flusher)
	event := func(name string, data any) {
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		if fl != nil {
			fl.Flush()
		}
	}
	start := map[string]any{}
	for k, v := range msg {
		start[k] = v
	}
	start["content"], start["stop_reason"] = []any{}, nil
	event("message_start", map[string]any{"type": "message_start", "message": start})
	for i, b := range blocks {
		switch b["type"] {
		case "text":
			event("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}})
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": b["text"]}})
		case "tool_use":
			event("content_block_start", map[string]any{"type": "content_block_start", "index": i,
				"content_block": map[string]any{"type": "tool_use", "id": b["id"], "name": b["name"], "input": map[string]any{}}})
			in, _ := json.Marshal(b["input"])
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": string(in)}})
		}
		event("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
	}
	event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]any{"output_tokens": 10}})
	event("message_stop", map[string]any{"type": "message_stop"})
}

// TestAgentRunClaude drives the real Claude Code CLI of the claude preset's
// image with a scripted model server under the real API name
// (api.anthropic.com, through the host-side hosts file and a test CA the
// gateway trusts): the model has the agent edit a file in /work and then
// push to main on a real git http-backend whose profile refuses pushes to
// main. The edit must be on the host, the refusal in the agent's
// transcript and in the log, and the model server must have seen the
// host's key on every request, never the guest's placeholder.
func TestAgentRunClaude(t *testing.T) { testAgentRunClaude(t, false) }

// TestAgentRunClaudeSignIn is the same with the host user's Claude sign-in
// imported (`smx creds login claude --import`) instead of an API key: the
// model server must see the host's access token as a bearer token, the
// guest only the placeholder sign-in.
func TestAgentRunClaudeSignIn(t *testing.T) { testAgentRunClaude(t, true) }

func testAgentRunClaude(t *testing.T, signIn bool) {
	model := &scriptedAnthropic{steps: []string{
		"cd /work && printf 'edited in the sandbox\\n' >> README.md && git commit -qam 'agent edit' && echo EDIT-DONE",
		"cd /work && git push origin HEAD:main 2>&1; echo PUSH-RC=$?",
		"smx-why; head -1 ~/.claude/CLAUDE.md; id; stat -c 'work-owner %u:%g' /work/README.md",
	}}
	w := newAgentWorld(t, "claude", "api.anthropic.com", model, false)

	const apiKey = "sk-ant-api03-hostkey-5b0c9e1d7a3f"
	wantKey := apiKey
	if !signIn {
		w.login("key stored as claude", []string{"TEST_ANTHROPIC_KEY=" + apiKey}, "--from-env", "TEST_ANTHROPIC_KEY")
	} else {
		// The sign-in expires in 4 minutes: the host refreshes it (at a
		// token endpoint on loopback the user preset points at) before the
		// first model call, once, and the model sees only the new token.
		const token = "sk-ant-oat01-hosttoken-4c2e9a7b1d"
		const refreshed = "sk-ant-oat01-refreshed-93be0d1f"
		var refreshes atomic.Int32
		tokens := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			var body map[string]string
			json.NewDecoder(r.Body).Decode(&body)
			if body["grant_type"] != "refresh_token" || body["refresh_token"] != "sk-ant-ort01-hostrefresh" || body["client_id"] == "" {
				http.Error(rw, `{"error":"invalid_grant"}`, http.StatusBadRequest)
				return
			}
			refreshes.Add(1)
			fmt.Fprintf(rw, `{"access_token":%q,"refresh_token":"sk-ant-ort01-rotated","expires_in":28800}`, refreshed)
		}))
		t.Cleanup(tokens.Close)
		t.Cleanup(func() {
			if n := refreshes.Load(); n != 1 {
				t.Errorf("the token endpoint was asked %d times, want once", n)
			}
		})
		w.overridePreset("token_url: https://console.anthropic.com/v1/oauth/token", "token_url: "+tokens.URL)
		wantKey = "Bearer " + refreshed
		userHome := t.TempDir()
		os.MkdirAll(filepath.Join(userHome, ".claude"), 0o700)
		os.WriteFile(filepath.Join(userHome, ".claude", ".credentials.json"), []byte(fmt.Sprintf(
			`{"claudeAiOauth":{"accessToken":%q,"refreshToken":"sk-ant-ort01-hostrefresh","expiresAt":%d,"scopes":["user:inference","user:profile"],"subscriptionType":"max"}}`,
			token, time.Now().Add(4*time.Minute).UnixMilli())), 0o600)
		w.login("sign-in (max) imported", []string{"HOME=" + userHome}, "--import")
	}

	out, err := w.run("-p", "Edit README.md and push it to main.", "--output-format", "stream-json", "--verbose")
	if err != nil {
		t.Fatalf("agent run: %v\n%s", err, out)
	}
	// The transcript shows the edit and the gateway's refusal.
	for _, want := range []string{"EDIT-DONE", "smx: push to refs/heads/main denied", "PUSH-RC=1", "All steps are done.",
		// smx-why lists the refusal with its rule; the instructions file is there.
		"git.refused op=push repo=forge.test/acme/app ref=refs/heads/main", "repo.yaml:12:11 git.repos[0].refs[0]", "# You are running in an smx sandbox",
		// The agent runs as the image's unprivileged user, and sees the
		// workspace as its own (the mount's uid=1000,gid=1000).
		"uid=1000(user) gid=1000(user)", "work-owner 1000:1000"} {
		if !strings.Contains(out, want) {
			t.Errorf("transcript lacks %q", want)
		}
	}
	logs := w.checkOutcome(out, "edited in the sandbox", "anthropic", strings.TrimPrefix(wantKey, "Bearer "))
	if signIn && (!strings.Contains(logs, `"kind":"cred.refresh"`) || !strings.Contains(logs, `"secret":"claude"`) ||
		strings.Contains(logs, "hosttoken") || strings.Contains(logs, "ort01")) {
		t.Errorf("the log lacks the sign-in's cred.refresh, or holds a token")
	}
	model.mu.Lock()
	calls, results := model.calls, model.toolResults
	model.mu.Unlock()
	checkKeys(t, calls, wantKey,
		func(p string) bool { return strings.HasPrefix(p, "POST /v1/messages") },
		func(p string) bool { return strings.HasPrefix(p, "GET /api/oauth/") })
	if !strings.Contains(strings.Join(results, "\n"), "smx: push to refs/heads/main denied") {
		t.Errorf("the tool results the model got lack the refusal: %q", results)
	}
	if t.Failed() || testing.Verbose() {
		t.Logf("model requests: %q\ntranscript:\n%s\nlog:\n%s", calls.paths, out, logs)
	}
}
