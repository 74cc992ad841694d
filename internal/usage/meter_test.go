package usage

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/policy"
)

// A request budget is exact under concurrency, a token budget stops the
// request after the one that crossed it, a daily budget starts again at
// UTC midnight, and a new Meter on the same file carries on.
func TestMeter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.json")
	now := time.Date(2026, 12, 4, 23, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	m, err := NewMeter(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	reqs := &policy.Budget{Requests: 5, Per: policy.BudgetPerSandbox}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if m.Admit("a", reqs, true) == nil {
				mu.Lock()
				admitted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted != 5 {
		t.Fatalf("admitted %d of 20 racing requests under a budget of 5", admitted)
	}
	var ex *Exhausted
	if err := m.Admit("a", reqs, false); !errors.As(err, &ex) || ex.What != "requests" || ex.Used != 5 ||
		!strings.Contains(err.Error(), "used 5 of its budget of 5 requests in this sandbox") {
		t.Fatalf("a non-model request past the budget: %v", err)
	}

	toks := &policy.Budget{Tokens: 100, Per: policy.BudgetPerDay}
	if err := m.Admit("b", toks, true); err != nil {
		t.Fatal(err)
	}
	m.Add("b", Tokens{Input: 80, Output: 30}, true)
	if err := m.Admit("b", toks, true); !errors.As(err, &ex) || ex.What != "tokens" || ex.Used != 110 ||
		!strings.Contains(err.Error(), "today (UTC)") {
		t.Fatalf("past the token budget: %v", err)
	}
	// A restarted supervisor reads the same totals.
	m2, err := NewMeter(path, clock)
	if err != nil {
		t.Fatal(err)
	}
	if err := m2.Admit("b", toks, true); err == nil {
		t.Fatal("a new meter on the same file forgot the day's tokens")
	}
	got := m2.Spent()
	if got["a"].Requests != 5 || got["b"].Requests != 1 || got["b"].Input != 80 || got["b"].DayTokens != 110 {
		t.Fatalf("reloaded totals %+v", got)
	}
	// The next UTC day the daily budget is fresh; the sandbox total stays.
	now = now.Add(2 * time.Hour)
	if err := m2.Admit("b", toks, true); err != nil {
		t.Fatalf("next day: %v", err)
	}
	got = m2.Spent()
	if b := got["b"]; b.Day != "2026-12-05" || b.DayRequests != 1 || b.DayTokens != 0 || b.Requests != 2 || b.Total() != 110 {
		t.Fatalf("next day totals %+v", b)
	}
	// The file, rewritten in place (shorter: the day's counts reset),
	// still reads whole.
	if f, err := Load(path); err != nil || f["b"].Day != "2026-12-05" || f["b"].Requests != 2 {
		t.Fatalf("file after the day rolled: %+v, %v", f, err)
	}
	// A request discovered late (its answer carried usage) is counted.
	m2.Add("c", Tokens{Output: 7}, false)
	if c := m2.Spent()["c"]; c.Requests != 1 || c.Output != 7 {
		t.Fatalf("late request %+v", c)
	}
}

// Each provider's quota answer is the shape its own client reads, and
// says not to retry.
func TestWriteExhausted(t *testing.T) {
	for p, want := range map[Provider]struct {
		status int
		path   []string
		value  string
	}{
		Anthropic: {402, []string{"error", "type"}, "billing_error"},
		OpenAI:    {429, []string{"error", "code"}, "insufficient_quota"},
		Gemini:    {429, []string{"error", "status"}, "RESOURCE_EXHAUSTED"},
		"":        {429, []string{"error", "type"}, "insufficient_quota"},
	} {
		w := httptest.NewRecorder()
		WriteExhausted(w, p, "smx: spent")
		var body map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		v := any(body)
		for _, k := range want.path {
			v = v.(map[string]any)[k]
		}
		msg := body["error"].(map[string]any)["message"]
		if w.Code != want.status || v != want.value || msg != "smx: spent" || w.Header().Get("X-Should-Retry") != "false" {
			t.Errorf("%q: %d %s", p, w.Code, w.Body)
		}
	}
}

func TestProviderFor(t *testing.T) {
	for _, tc := range []struct {
		host, path string
		want       Provider
		model      bool
	}{
		{"api.anthropic.com", "/v1/messages", Anthropic, true},
		{"model.test", "/v1/messages/count_tokens", Anthropic, false},
		{"api.openai.com", "/v1/responses", OpenAI, true},
		{"model.test", "/v1/chat/completions", OpenAI, true},
		{"generativelanguage.googleapis.com", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", Gemini, true},
		{"api.anthropic.com", "/api/oauth/profile", Anthropic, false},
		{"model.test", "/health", "", false},
	} {
		if got := ProviderFor(tc.host, tc.path, nil); got != tc.want || ModelRequest(tc.path) != tc.model {
			t.Errorf("%s%s: %q %v", tc.host, tc.path, got, ModelRequest(tc.path))
		}
	}
}

// An uncapped credential's totals reach the file within flushDelay, not
// on every change; Close writes what is pending.
func TestMeterDeferredWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.json")
	m, err := NewMeter(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	m.Admit("free", nil, true)
	m.Add("free", Tokens{Input: 5, Output: 2}, true)
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, _ := Load(path)
		if f["free"].Requests == 1 && f["free"].Output == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the totals never reached the file: %+v", f)
		}
		time.Sleep(10 * time.Millisecond)
	}
	m.Add("free", Tokens{Output: 3}, false)
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if f, _ := Load(path); f["free"].Requests != 2 || f["free"].Output != 5 {
		t.Fatalf("after Close the file holds %+v", f["free"])
	}
}
