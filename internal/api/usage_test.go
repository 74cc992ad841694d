package api_test

import (
	"encoding/json"
	"testing"
	"time"

	wire "github.com/smx-dev/smx/api"
)

// A sandbox's usage, as the API answers it, matches api/openapi.yaml.
func TestSandboxUsageSchema(t *testing.T) {
	doc, _ := openAPI(t)
	sb := wire.Sandbox{Name: "a", Status: "running", Image: "busybox", Profile: "dev", ProfileHash: "sha256:x", CPUs: 1,
		MemoryMiB: 256, DiskBytes: 1, Created: time.Now(),
		Usage: []wire.CredentialUsage{
			{Credential: "claude", Requests: 3, InputTokens: 60, OutputTokens: 30, CacheReadTokens: 5, Day: "2026-12-04", DayRequests: 3,
				DayTokens: 90, Budget: &wire.Budget{Requests: 3, Per: "sandbox"}},
			{Credential: "openai", Requests: 1, InputTokens: 1, OutputTokens: 1},
		}}
	b, _ := json.Marshal(sb)
	var v any
	json.Unmarshal(b, &v)
	if err := doc.Components.Schemas["Sandbox"].Value.VisitJSON(v); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
}
