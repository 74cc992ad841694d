package cli_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// scriptedGemini is test code: a scripted model server speaking enough of
// the Gemini API (models/MODEL:streamGenerateContent?alt=sse and
// :generateContent, :countTokens) to drive the real Gemini CLI through
// tool calls. An agent-loop request (one that declares the shell tool,
// run_shell_command) gets a functionCall part running the step numbered by
// the functionResponse parts its contents hold; after the last step, a
// closing text. Other requests (the CLI's model router and next-speaker
// checks, which want JSON) get one JSON text that answers both.
type scriptedGemini struct {
	steps []string

	mu        sync.Mutex
	calls     modelCalls // x-goog-api-key of every request, or its Authorization when it has none
	responses []string   // every functionResponse the agent sent back
	tools     []string
	last      []byte
}

func (m *scriptedGemini) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k := r.Header.Get("x-goog-api-key")
	if k == "" {
		k = r.Header.Get("Authorization")
	}
	m.mu.Lock()
	m.calls.keys = append(m.calls.keys, k)
	m.calls.paths = append(m.calls.paths, r.Method+" "+r.URL.Path)
	m.mu.Unlock()
	_, method, _ := strings.Cut(r.URL.Path, ":")
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1beta/models/") {
		http.NotFound(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	if method == "countTokens" {
		fmt.Fprint(w, `{"totalTokens": 12}`)
		return
	}
	if method != "generateContent" && method != "streamGenerateContent" {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Contents []struct {
			Role  string `json:"role"`
			Parts []struct {
				FunctionResponse *struct {
					Name     string          `json:"name"`
					Response json.RawMessage `json:"response"`
				} `json:"functionResponse"`
			} `json:"parts"`
		} `json:"contents"`
		Tools []struct {
			FunctionDeclarations []struct {
				Name string `json:"name"`
			} `json:"functionDeclarations"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var tools, responses []string
	for _, t := range req.Tools {
		for _, d := range t.FunctionDeclarations {
			tools = append(tools, d.Name)
		}
	}
	for _, c := range req.Contents {
		for _, p := range c.Parts {
			if p.FunctionResponse != nil {
				responses = append(responses, string(p.FunctionResponse.Response))
			}
		}
	}
	agentLoop := false
	for _, t := range tools {
		agentLoop = agentLoop || t == "run_shell_command"
	}
	var parts []map[string]any
	switch {
	case !agentLoop:
		parts = []map[string]any{{"text": `{"reasoning": "A bounded task.", "model_choice": "flash", "next_speaker": "user"}`}}
	case len(responses) < len(m.steps):
		n := len(responses) + 1
		parts = []map[string]any{{"functionCall": map[string]any{"name": "run_shell_command",
			"args": map[string]any{"command": m.steps[n-1], "description": fmt.Sprintf("step %d", n)}}}}
	default:
		parts = []map[string]any{{"text": "All steps are done."}}
	}
	if agentLoop {
		m.mu.Lock()
		m.tools, m.responses, m.last = tools, responses, body
		m.mu.Unlock()
	}
	resp := map[string]any{
		"candidates":    []any{map[string]any{"content": map[string]any{"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}},
		"usageMetadata": map[string]any{"promptTokenCount": 20, "candidatesTokenCount": 10, "totalTokenCount": 30},
		"modelVersion":  "smx-scripted",
		"responseId":    "smx-scripted-response",
	}
	b, _ := json.Marshal(resp)
	if method == "generateContent" {
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
		return
	}
	// Server-sent events, one chunk: what @google/genai reads for
	// alt=sse.
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: %s\r\n\r\n", b)
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}

// TestAgentRunGemini drives the real Gemini CLI of the gemini preset's
// image with a scripted Gemini API server as
// generativelanguage.googleapis.com, in the same world as
// TestAgentRunClaude: edit a file in /work, push to main through the Git
// gateway (refused). It is in the slow suite: CI does not build the gemini
// image (minutes); SMX_TEST_SLOW=1 builds it into $SMX_TEST_IMAGES once
// per recipe, and the test skips, saying so, when neither has it.
//
// The CLI runs headless (`-p PROMPT`, from its option table) with the
// preset's --yolo, which it keeps only in a trusted folder (the preset
// trusts /work).
func TestAgentRunGemini(t *testing.T) {
	model := &scriptedGemini{steps: []string{
		"cd /work && printf 'edited by gemini\\n' >> README.md && git commit -qam 'agent edit' && echo EDIT-DONE",
		"cd /work && git push origin HEAD:main 2>&1; echo PUSH-RC=$?",
		"smx-why; head -1 ~/.gemini/GEMINI.md; id; echo KEY=$GEMINI_API_KEY",
	}}
	w := newAgentWorld(t, "gemini", "generativelanguage.googleapis.com", model, true)
	const apiKey = "AIzaSy-hostkey-0c4f9e2b7d"
	w.login("key stored as gemini", []string{"TEST_GEMINI_KEY=" + apiKey}, "--from-env", "TEST_GEMINI_KEY")

	out, err := w.run("-p", "Edit README.md and push it to main.", "--output-format", "stream-json")
	model.mu.Lock()
	calls, responses, tools, last := model.calls, model.responses, model.tools, string(model.last)
	model.mu.Unlock()
	if err != nil {
		t.Fatalf("agent run: %v\nmodel requests %q tools %q\n%s", err, calls.paths, tools, out)
	}
	joined := strings.Join(responses, "\n")
	for _, want := range []string{"EDIT-DONE", "smx: push to refs/heads/main denied", "PUSH-RC=1",
		"git.refused op=push repo=forge.test/acme/app ref=refs/heads/main", "repo.yaml:12:11 git.repos[0].refs[0]",
		"# You are running in an smx sandbox", "uid=1000(user) gid=1000(user)", "KEY=smx-placeholder"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the function responses the model got lack %q", want)
		}
	}
	for _, want := range []string{"smx: push to refs/heads/main denied", "All steps are done."} {
		if !strings.Contains(out, want) {
			t.Errorf("transcript lacks %q", want)
		}
	}
	logs := w.checkOutcome(out, "edited by gemini", "gemini", apiKey)
	checkKeys(t, calls, apiKey, func(p string) bool { return strings.HasPrefix(p, "POST /v1beta/models/") }, nil)
	if t.Failed() || testing.Verbose() {
		if len(last) > 6000 {
			last = last[:6000]
		}
		t.Logf("model requests %q tools %q responses %q\nlast agent request:\n%s\ntranscript:\n%s\nlog:\n%s", calls.paths, tools, responses, last, out, logs)
	}
}
