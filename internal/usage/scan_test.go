package usage

import (
	"bytes"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

// Every provider's answer, streamed and not, gives the same tokens
// whichever way the bytes are split into chunks; text and tool input that
// look like usage never make the count smaller.
func TestScanner(t *testing.T) {
	for _, tc := range []struct {
		file  string
		want  Tokens
		model string
	}{
		{"anthropic.json", Tokens{Input: 1150, Output: 42, CacheRead: 1000, CacheWrite: 30}, "claude-sonnet-4-5"},
		{"anthropic.sse", Tokens{Input: 1150, Output: 42, CacheRead: 1000, CacheWrite: 30}, "claude-sonnet-4-5"},
		{"responses.json", Tokens{Input: 1150, Output: 42, CacheRead: 1000}, "gpt-5-codex"},
		{"responses.sse", Tokens{Input: 1150, Output: 42, CacheRead: 1000}, "gpt-5-codex"},
		{"chat.json", Tokens{Input: 1150, Output: 42, CacheRead: 1000}, "gpt-4o-2024-08-06"},
		{"chat.sse", Tokens{Input: 1150, Output: 42, CacheRead: 1000}, "gpt-4o-2024-08-06"},
		{"gemini.json", Tokens{Input: 1150, Output: 42, CacheRead: 1000}, "gemini-2.5-pro"},
		{"gemini.sse", Tokens{Input: 1150, Output: 42, CacheRead: 1000}, "gemini-2.5-pro"},
	} {
		body, err := os.ReadFile("testdata/" + tc.file)
		if err != nil {
			t.Fatal(err)
		}
		check := func(how string, chunks [][]byte) {
			t.Helper()
			var s Scanner
			for _, c := range chunks {
				s.Write(c)
			}
			got, model, found := s.Result()
			if !found || got != tc.want || model != tc.model {
				t.Errorf("%s %s: got %+v model %q found %v, want %+v %q", tc.file, how, got, model, found, tc.want, tc.model)
			}
		}
		check("whole", [][]byte{body})
		for at := 1; at < len(body); at++ {
			check("split at "+itoa(int64(at)), [][]byte{body[:at], body[at:]})
		}
		var bytewise [][]byte
		for i := range body {
			bytewise = append(bytewise, body[i:i+1])
		}
		check("byte by byte", bytewise)
		r := rand.New(rand.NewPCG(1, 2))
		for range 50 {
			var chunks [][]byte
			for rest := body; len(rest) > 0; {
				n := min(len(rest), 1+r.IntN(40))
				chunks = append(chunks, rest[:n])
				rest = rest[n:]
			}
			check("random chunks", chunks)
		}
	}
}

// A body without usage (an error, a model list) says so.
func TestScannerNoUsage(t *testing.T) {
	for _, b := range []string{
		`{"type":"error","error":{"type":"overloaded_error","message":"usage: high"}}`,
		`{"data":[{"id":"claude-x","type":"model"}]}`,
		`{"usage": null, "x": "usage"}`,
		`{"usage": {"plan": "pro"}}`,
	} {
		var s Scanner
		s.Write([]byte(b))
		if tk, _, found := s.Result(); found {
			t.Errorf("%s: found %+v", b, tk)
		}
	}
}

func FuzzScanner(f *testing.F) {
	for _, n := range []string{"anthropic.sse", "chat.json", "gemini.sse"} {
		b, _ := os.ReadFile("testdata/" + n)
		f.Add(b, 7)
	}
	f.Fuzz(func(t *testing.T, b []byte, split int) {
		var whole, parts Scanner
		whole.Write(b)
		if split <= 0 {
			split = 1
		}
		for rest := b; len(rest) > 0; {
			n := min(len(rest), split)
			parts.Write(rest[:n])
			rest = rest[n:]
		}
		w1, m1, f1 := whole.Result()
		w2, m2, f2 := parts.Result()
		if w1 != w2 || m1 != m2 || f1 != f2 {
			t.Fatalf("whole %+v %q %v, split %d: %+v %q %v", w1, m1, f1, split, w2, m2, f2)
		}
	})
}

// A streamed chat request is made to end with usage; anything else is
// left as it is.
func TestIncludeUsage(t *testing.T) {
	for in, want := range map[string]string{
		`{"model":"m","stream":true}`:                                    `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
		`{"stream":true,"stream_options":{"include_usage":false}}`:       `{"stream":true,"stream_options":{"include_usage":true}}`,
		`{"stream":true,"stream_options":null}`:                          `{"stream":true,"stream_options":{"include_usage":true}}`,
		`{"stream":true,"stream_options":{"include_obfuscation":false}}`: `{"stream":true,"stream_options":{"include_obfuscation":false,"include_usage":true}}`,
		`{"stream":true,"stream_options":{"include_usage":true}}`:        ``,
		`{"stream":false}`: ``,
		`{"model":"m"}`:    ``,
		`not json`:         ``,
	} {
		got, changed := IncludeUsage([]byte(in))
		if want == "" {
			if changed || string(got) != in {
				t.Errorf("%s: changed to %s", in, got)
			}
			continue
		}
		if !changed || string(got) != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

// BenchmarkScanner is the scanner alone on a 4 MiB Anthropic stream of
// text deltas, fed in the 32 KiB chunks the broker's proxy reads: its
// cost next to the broker's own throughput (BenchmarkBrokerUsage in
// internal/netstack).
func BenchmarkScanner(b *testing.B) {
	sse, _ := os.ReadFile("testdata/anthropic.sse")
	head := sse[:bytes.Index(sse, []byte("event: content_block_start"))]
	delta := []byte("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"" +
		strings.Repeat("The model writes code and prose. ", 6) + "\"}}\n\n")
	body := append([]byte{}, head...)
	for len(body) < 4<<20 {
		body = append(body, delta...)
	}
	body = append(body, "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40000}}\n\n"...)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		var s Scanner
		for rest := body; len(rest) > 0; {
			n := min(len(rest), 32<<10)
			s.Write(rest[:n])
			rest = rest[n:]
		}
		if t, _, _ := s.Result(); t.Output != 40000 {
			b.Fatalf("%+v", t)
		}
	}
}
