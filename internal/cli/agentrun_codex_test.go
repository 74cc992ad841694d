package cli_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// scriptedOpenAI is test code: a scripted model server speaking enough of
// the OpenAI Responses API (streaming) to drive the real Codex CLI through
// tool calls. WebSocket upgrades are declined, so Codex falls back to
// HTTPS. Each request gets the step numbered by the tool outputs its input
// holds.
type scriptedOpenAI struct {
	steps []string

	mu      sync.Mutex
	calls   modelCalls // Authorization of every request
	outputs []string
	tools   []string
	last    []byte // the last request body, for failure messages
}

func (m *scriptedOpenAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.calls.keys = append(m.calls.keys, r.Header.Get("Authorization"))
	m.calls.paths = append(m.calls.paths, r.Method+" "+r.URL.Path)
	m.mu.Unlock()
	if r.Header.Get("Upgrade") != "" || r.URL.Path != "/v1/responses" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Model string            `json:"model"`
		Input []json.RawMessage `json:"input"`
		Tools []tool            `json:"tools"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var outputs []string
	for _, raw := range req.Input {
		var it struct {
			Type   string          `json:"type"`
			Output json.RawMessage `json:"output"`
			Tools  []tool          `json:"tools"`
		}
		if json.Unmarshal(raw, &it) != nil {
			continue
		}
		switch it.Type {
		case "function_call_output", "custom_tool_call_output":
			outputs = append(outputs, string(it.Output))
		case "additional_tools": // Codex 0.17x offers its tools in the input
			req.Tools = append(req.Tools, it.Tools...)
		}
	}
	var names []string
	var walk func([]tool, string)
	walk = func(ts []tool, prefix string) {
		for _, t := range ts {
			names = append(names, prefix+t.Type+":"+t.Name)
			walk(t.Tools, t.Name+"/")
		}
	}
	walk(req.Tools, "")
	m.mu.Lock()
	m.tools, m.outputs, m.last = names, outputs, body
	m.mu.Unlock()
	step := len(outputs)
	var item map[string]any
	if step < len(m.steps) {
		cmd := m.steps[step]
		var args any
		name := ""
		for _, n := range names {
			switch n {
			case "shell":
				name, args = n, map[string]any{"command": []string{"bash", "-lc", cmd}}
			case "shell_command":
				name, args = n, map[string]any{"command": cmd}
			case "exec_command":
				name, args = n, map[string]any{"cmd": cmd}
			}
			if name != "" {
				break
			}
		}
		a, _ := json.Marshal(args)
		item = map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%d", step+1), "call_id": fmt.Sprintf("call_smx_%d", step+1),
			"name": name, "arguments": string(a), "status": "completed"}
		if slices.Contains(names, "functions/custom:exec") {
			// Codex 0.17x's code mode: one freeform tool running
			// JavaScript that calls the nested tools.
			c, _ := json.Marshal(cmd)
			item = map[string]any{"type": "custom_tool_call", "id": fmt.Sprintf("ctc_%d", step+1), "call_id": fmt.Sprintf("call_smx_%d", step+1),
				"name": "exec", "status": "completed",
				"input": "const r = await tools.exec_command({cmd: " + string(c) + ", yield_time_ms: 60000});\ntext(typeof r === \"string\" ? r : JSON.stringify(r));\n"}
		}
	} else {
		item = map[string]any{"type": "message", "id": "msg_done", "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": "All steps are done.", "annotations": []any{}}}}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	event := func(name string, data map[string]any) {
		data["type"] = name
		b, _ := json.Marshal(data)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		if fl != nil {
			fl.Flush()
		}
	}
	id := fmt.Sprintf("resp_smx_%d", time.Now().UnixNano())
	resp := map[string]any{"id": id, "object": "response", "created_at": time.Now().Unix(), "status": "in_progress", "model": req.Model, "output": []any{}}
	event("response.created", map[string]any{"response": resp})
	event("response.output_item.added", map[string]any{"output_index": 0, "item": item})
	event("response.output_item.done", map[string]any{"output_index": 0, "item": item})
	done := map[string]any{"id": id, "object": "response", "created_at": time.Now().Unix(), "status": "completed", "model": req.Model,
		"output": []any{item}, "usage": map[string]any{"input_tokens": 10, "input_tokens_details": map[string]any{"cached_tokens": 0},
			"output_tokens": 5, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": 15}}
	event("response.completed", map[string]any{"response": done})
}

type tool struct {
	Type  string `json:"type"`
	Name  string `json:"name"`
	Tools []tool `json:"tools"`
}

// TestAgentRunCodex drives the real Codex CLI of the codex preset's image
// with a scripted Responses server as api.openai.com: edit a file in /work,
// push to main through the Git gateway (refused), as TestAgentRunClaude.
// Codex runs `codex exec` with its own sandbox off (a user preset with the
// same recipe): the VM is the sandbox, and Codex's would keep git from the
// network.
func TestAgentRunCodex(t *testing.T) {
	model := &scriptedOpenAI{steps: []string{
		"cd /work && printf 'edited by codex\\n' >> README.md && git commit -qam 'agent edit' && echo EDIT-DONE",
		"cd /work && git push origin HEAD:main 2>&1; echo PUSH-RC=$?",
	}}
	w := newAgentWorld(t, "codex", "api.openai.com", model, false)
	w.overridePreset("command: [codex, --sandbox, workspace-write, --ask-for-approval, never]",
		"command: [codex, exec, --dangerously-bypass-approvals-and-sandbox, --skip-git-repo-check]")
	const apiKey = "sk-proj-hostkey-2f8e6d4c1a"
	w.login("key stored as codex", []string{"TEST_OPENAI_KEY=" + apiKey}, "--from-env", "TEST_OPENAI_KEY")

	out, err := w.run("Edit README.md and push it to main.")
	model.mu.Lock()
	calls, outputs, tools := model.calls, model.outputs, model.tools
	model.mu.Unlock()
	if err != nil {
		t.Fatalf("agent run: %v\nmodel requests %q tools %q\n%s", err, calls.paths, tools, out)
	}
	joined := strings.Join(outputs, "\n")
	for _, want := range []string{"EDIT-DONE", "smx: push to refs/heads/main denied", "PUSH-RC=1"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the tool outputs the model got lack %q", want)
		}
	}
	if !strings.Contains(out, "All steps are done.") {
		t.Errorf("transcript lacks the model's last message")
	}
	w.checkOutcome(out, "edited by codex", "openai", apiKey)
	// Codex's WebSocket attempts (GET /v1/responses with Upgrade) are
	// model calls too: the key goes with the upgrade.
	checkKeys(t, calls, "Bearer "+apiKey,
		func(p string) bool { return strings.HasSuffix(p, " /v1/responses") },
		func(p string) bool { return strings.HasPrefix(p, "GET /v1/models") })
	if t.Failed() || testing.Verbose() {
		model.mu.Lock()
		last := string(model.last)
		model.mu.Unlock()
		if len(last) > 6000 {
			last = last[:6000]
		}
		t.Logf("model requests %q tools %q outputs %q\nlast request:\n%s\ntranscript:\n%s", calls.paths, tools, outputs, last, out)
	}
}
