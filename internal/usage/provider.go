package usage

import (
	"encoding/json"
	"net/http"
	"strings"
)

// Provider is a model API whose usage and errors this package knows.
type Provider string

const (
	Anthropic Provider = "anthropic"
	OpenAI    Provider = "openai"
	Gemini    Provider = "gemini"
)

// ProviderFor names the API a request is for: by its path first (the
// endpoints that bill tokens), then by the host it goes to, then by a
// header only that API's clients send; "" when nothing says.
func ProviderFor(host, path string, h http.Header) Provider {
	switch {
	case strings.HasPrefix(path, "/v1/messages") || path == "/v1/complete":
		return Anthropic
	case path == "/v1/responses" || strings.HasPrefix(path, "/v1/responses/") || path == "/v1/chat/completions" ||
		path == "/v1/completions" || path == "/v1/embeddings":
		return OpenAI
	case strings.Contains(path, ":generateContent") || strings.Contains(path, ":streamGenerateContent") ||
		strings.Contains(path, ":countTokens") || strings.Contains(path, ":embedContent"):
		return Gemini
	}
	host = strings.ToLower(host)
	switch {
	case host == "anthropic.com" || strings.HasSuffix(host, ".anthropic.com"):
		return Anthropic
	case host == "openai.com" || strings.HasSuffix(host, ".openai.com"):
		return OpenAI
	case strings.HasSuffix(host, ".googleapis.com"):
		return Gemini
	}
	switch {
	case h.Get("Anthropic-Version") != "":
		return Anthropic
	case h.Get("X-Goog-Api-Key") != "":
		return Gemini
	}
	return ""
}

// ModelRequest says whether a request to path bills tokens: the
// endpoints that generate (a request budget counts these). Other
// requests through the credential are counted when their answer carries
// usage.
func ModelRequest(path string) bool {
	switch {
	case path == "/v1/messages", path == "/v1/complete", path == "/v1/responses", path == "/v1/chat/completions",
		path == "/v1/completions":
		return true
	}
	return strings.HasSuffix(path, ":generateContent") || strings.HasSuffix(path, ":streamGenerateContent")
}

// WriteExhausted answers a request the way provider p answers one when
// the account's quota is spent, with msg as the error's message, so that
// the provider's own client shows msg and stops instead of retrying:
//
//   - Anthropic: 402 billing_error (its SDKs retry 429, never 402)
//   - OpenAI and others: 429 insufficient_quota, the code OpenAI's
//     clients treat as final
//   - Gemini: 429 RESOURCE_EXHAUSTED
//
// Every answer carries x-should-retry: false, which the Anthropic and
// OpenAI SDKs obey before their own retry rules.
func WriteExhausted(w http.ResponseWriter, p Provider, msg string) {
	var status int
	var body any
	switch p {
	case Anthropic:
		status = http.StatusPaymentRequired
		body = map[string]any{"type": "error", "error": map[string]any{"type": "billing_error", "message": msg}}
	case Gemini:
		status = http.StatusTooManyRequests
		body = map[string]any{"error": map[string]any{"code": 429, "message": msg, "status": "RESOURCE_EXHAUSTED"}}
	default:
		status = http.StatusTooManyRequests
		body = map[string]any{"error": map[string]any{"message": msg, "type": "insufficient_quota", "param": nil, "code": "insufficient_quota"}}
	}
	b, _ := json.Marshal(body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("X-Should-Retry", "false")
	h.Set("Content-Length", itoa(int64(len(b))))
	w.WriteHeader(status)
	w.Write(b)
}

// MaxRewrite bounds the request bodies IncludeUsage reads.
const MaxRewrite = 32 << 20

// IncludeUsage rewrites an OpenAI Chat Completions request body that asks
// for a stream so that the stream ends with usage
// (stream_options.include_usage): without it a streamed chat answer
// carries none, and a guest could spend tokens the gateway cannot count.
// It returns the body to send and whether it changed; a body that is not
// such a request (or not JSON) is returned as it is.
func IncludeUsage(body []byte) ([]byte, bool) {
	var req map[string]json.RawMessage
	if json.Unmarshal(body, &req) != nil {
		return body, false
	}
	var stream bool
	if json.Unmarshal(req["stream"], &stream) != nil || !stream {
		return body, false
	}
	opts := map[string]json.RawMessage{}
	if raw, ok := req["stream_options"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &opts) != nil {
			return body, false
		}
	}
	var inc bool
	if json.Unmarshal(opts["include_usage"], &inc) == nil && inc {
		return body, false
	}
	opts["include_usage"] = json.RawMessage("true")
	o, err := json.Marshal(opts)
	if err != nil {
		return body, false
	}
	req["stream_options"] = o
	out, err := json.Marshal(req)
	if err != nil {
		return body, false
	}
	return out, true
}
