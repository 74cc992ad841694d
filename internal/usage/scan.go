// Package usage reads what a model API says a request cost (the `usage`
// object of Anthropic and OpenAI answers, Gemini's `usageMetadata`) from
// the response bytes as they pass the credential broker, keeps a running
// total per credential for one sandbox, and writes each provider's own
// quota-exhaustion error when a budget is spent.
//
// Nothing here holds a response back: Scanner is an io.Writer fed a copy
// of each chunk after it is on its way to the guest.
package usage

import (
	"bytes"
	"encoding/json"
)

// Tokens is what one response (or a running total) reports, the same way
// for every provider: Input counts every input token, cached ones
// included (Anthropic's input_tokens + cache_creation_input_tokens +
// cache_read_input_tokens; OpenAI's input/prompt tokens; Gemini's
// promptTokenCount + toolUsePromptTokenCount); CacheRead and CacheWrite
// are the parts of Input read from and written to the provider's cache;
// Output counts generated tokens, reasoning included.
type Tokens struct {
	Input      int64 `json:"input_tokens"`
	Output     int64 `json:"output_tokens"`
	CacheRead  int64 `json:"cache_read_tokens,omitempty"`
	CacheWrite int64 `json:"cache_write_tokens,omitempty"`
}

// Total is what a budget's tokens count: input plus output.
func (t Tokens) Total() int64 { return t.Input + t.Output }

func (t *Tokens) add(u Tokens) {
	t.Input += u.Input
	t.Output += u.Output
	t.CacheRead += u.CacheRead
	t.CacheWrite += u.CacheWrite
}

// max keeps, field by field, the larger count. Streams repeat usage with
// growing, cumulative counts (Anthropic's message_start then
// message_delta, Gemini's every chunk, OpenAI's response.created with
// null then response.completed), so the largest of each is the answer.
// It also means an object that only looks like usage (a tool call's raw
// JSON input in a non-streamed answer, which the model writes) can make
// the count larger, never smaller.
func (t *Tokens) max(u Tokens) {
	t.Input = max(t.Input, u.Input)
	t.Output = max(t.Output, u.Output)
	t.CacheRead = max(t.CacheRead, u.CacheRead)
	t.CacheWrite = max(t.CacheWrite, u.CacheWrite)
}

// Scanner finds usage objects and the model's name in a response body
// given to Write in chunks of any size: JSON, server-sent events, or
// JSON lines. It looks only for the keys "usage", "usageMetadata",
// "model" and "modelVersion" (bytes.Index, so the bytes between cost
// little) and decodes the small value after each. A key inside a JSON
// string cannot match: the quotes around it would be escaped.
//
// A Scanner is not safe for concurrent use.
type Scanner struct {
	// Each, when set, is called with every usage object found (and the
	// model named so far), and Result sums them instead of keeping the
	// largest: for a stream of whole answers, such as the server's side of
	// a WebSocket session, where each usage is another request's.
	Each func(t Tokens, model string)

	tokens  Tokens
	model   string
	found   bool
	version bool // model came from modelVersion

	state   int
	key     int    // which key the value being read belongs to
	buf     []byte // the value being read
	depth   int
	inStr   bool
	escaped bool
	tail    []byte // the last bytes of the previous chunk, for keys split across chunks
}

const (
	sIdle = iota
	sColon
	sValue
	sObject
	sString
)

var keys = [...][]byte{
	kUsage:        []byte(`"usage"`),
	kUsageMeta:    []byte(`"usageMetadata"`),
	kModel:        []byte(`"model"`),
	kModelVersion: []byte(`"modelVersion"`),
}

const (
	kUsage = iota
	kUsageMeta
	kModel
	kModelVersion
)

const (
	maxKey   = len(`"usageMetadata"`)
	maxValue = 64 << 10 // a usage object is a few hundred bytes; a larger one is not read
	maxModel = 256
)

// Write scans p. It never fails.
func (s *Scanner) Write(p []byte) (int, error) {
	n := len(p)
	if len(s.tail) > 0 && s.state == sIdle {
		p = s.straddle(p)
	}
	for len(p) > 0 {
		if s.state != sIdle {
			p = s.step(p)
			continue
		}
		at, k := s.find(p)
		if at < 0 {
			s.keepTail(p)
			break
		}
		s.begin(k)
		p = p[at+len(keys[k]):]
	}
	return n, nil
}

// straddle finds a key that began in the previous chunks' tail and ends
// in p, and returns what of p is left to scan; without one, p whole (the
// tail stays, and keepTail adds to it).
func (s *Scanner) straddle(p []byte) []byte {
	var win [2 * maxKey]byte
	t := len(s.tail)
	j := append(win[:0], s.tail...)
	j = append(j, p[:min(len(p), maxKey)]...)
	best, bk := -1, 0
	for k, key := range keys {
		if !s.want(k) {
			continue
		}
		for off := 0; off < t; {
			i := bytes.Index(j[off:], key)
			if i < 0 {
				break
			}
			i += off
			if i < t && i+len(key) > t && (best < 0 || i < best) {
				best, bk = i, k
			}
			off = i + 1
		}
	}
	if best < 0 {
		return p
	}
	s.begin(bk)
	return p[best+len(keys[bk])-t:]
}

// keepTail keeps the last bytes scanned (up to one key less a byte), so
// that a key split across chunks is found.
func (s *Scanner) keepTail(p []byte) {
	const keep = maxKey - 1
	if len(p) >= keep {
		s.tail = append(s.tail[:0], p[len(p)-keep:]...)
		return
	}
	s.tail = append(s.tail, p...)
	if len(s.tail) > keep {
		s.tail = append(s.tail[:0], s.tail[len(s.tail)-keep:]...)
	}
}

// find returns the first key in p and which it is, or -1. Once a model is
// known only usage is looked for (a Gemini modelVersion still replaces a
// "model" found earlier).
func (s *Scanner) find(p []byte) (int, int) {
	at, which := -1, 0
	for k := range keys {
		if !s.want(k) {
			continue
		}
		lim := p
		if at >= 0 {
			lim = p[:min(len(p), at+len(keys[k]))]
		}
		if i := s.index(lim, k); i >= 0 && (at < 0 || i < at) {
			at, which = i, k
		}
	}
	return at, which
}

// anchors are the keys' tails that start with a byte rare in JSON text
// (not the quote, which is everywhere): bytes.Index skips to each
// occurrence of an anchor's first byte with IndexByte, and a frequent one
// makes it fall back to a comparison at every position, several times
// slower. off is where the anchor sits in its key.
var anchors = [...]struct {
	b   []byte
	off int
}{
	kUsage:        {[]byte(`usage"`), 1},
	kUsageMeta:    {[]byte(`Metadata"`), 6},
	kModel:        {[]byte(`model"`), 1},
	kModelVersion: {[]byte(`Version"`), 6},
}

// index is where key k first starts in p, or -1. A key that started in
// the previous chunk is straddle's.
func (s *Scanner) index(p []byte, k int) int {
	a, key := anchors[k], keys[k]
	for from := 0; from < len(p); {
		i := bytes.Index(p[from:], a.b)
		if i < 0 {
			return -1
		}
		start := from + i - a.off
		if start >= 0 && bytes.Equal(p[start:start+len(key)], key) {
			return start
		}
		from += i + 1
	}
	return -1
}

// want says whether key k is still looked for: usage always, "model"
// until a name is known, "modelVersion" (Gemini's, which replaces a
// "model" met earlier) until it is found.
func (s *Scanner) want(k int) bool {
	switch k {
	case kModel:
		return s.model == ""
	case kModelVersion:
		return !s.version
	}
	return true
}

func (s *Scanner) begin(k int) {
	s.key, s.state = k, sColon
	s.tail = s.tail[:0]
}

// step consumes p in a state after a key and returns the rest.
func (s *Scanner) step(p []byte) []byte {
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch s.state {
		case sColon:
			if isSpace(c) {
				continue
			}
			if c != ':' {
				s.state = sIdle // a value that is the word "usage", not a key
				return p[i:]
			}
			s.state = sValue
		case sValue:
			if isSpace(c) {
				continue
			}
			model := s.key == kModel || s.key == kModelVersion
			switch {
			case c == '{' && !model:
				s.state, s.depth, s.inStr, s.escaped = sObject, 1, false, false
				s.buf = append(s.buf[:0], c)
			case c == '"' && model:
				s.state, s.escaped = sString, false
				s.buf = s.buf[:0]
			default: // null, a number, a list: nothing to read
				s.state = sIdle
				return p[i:]
			}
		case sObject:
			// Copy the run up to the next byte that matters in one go.
			j := i
			for j < len(p) && !special(p[j]) {
				j++
			}
			s.buf = append(s.buf, p[i:j]...)
			if j == len(p) {
				i = j
				break
			}
			i = j
			c = p[i]
			s.buf = append(s.buf, c)
			switch {
			case s.escaped:
				s.escaped = false
			case s.inStr && c == '\\':
				s.escaped = true
			case c == '"':
				s.inStr = !s.inStr
			case !s.inStr && c == '{':
				s.depth++
			case !s.inStr && c == '}':
				s.depth--
				if s.depth == 0 {
					s.usage(s.buf)
					s.state = sIdle
					return p[i+1:]
				}
			}
			if len(s.buf) > maxValue {
				s.state = sIdle
				return p[i+1:]
			}
		case sString:
			switch {
			case s.escaped:
				s.escaped = false
			case c == '\\':
				s.escaped = true
			case c == '"':
				var m string
				if json.Unmarshal(append(append([]byte{'"'}, s.buf...), '"'), &m) == nil && m != "" {
					s.model = m
					s.version = s.key == kModelVersion
				}
				s.state = sIdle
				return p[i+1:]
			}
			s.buf = append(s.buf, c)
			if len(s.buf) > maxModel {
				s.state = sIdle
				return p[i+1:]
			}
		}
	}
	return nil
}

func special(c byte) bool { return c == '"' || c == '\\' || c == '{' || c == '}' }

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// raw has every field the three providers put in a usage object.
type raw struct {
	// Anthropic, OpenAI Responses
	InputTokens   int64 `json:"input_tokens"`
	OutputTokens  int64 `json:"output_tokens"`
	CacheCreation int64 `json:"cache_creation_input_tokens"`
	CacheRead     int64 `json:"cache_read_input_tokens"`
	InputDetails  struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	// OpenAI Chat Completions
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	PromptDetails    struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// Gemini usageMetadata
	PromptTokenCount        int64 `json:"promptTokenCount"`
	ToolUsePromptTokenCount int64 `json:"toolUsePromptTokenCount"`
	CandidatesTokenCount    int64 `json:"candidatesTokenCount"`
	ThoughtsTokenCount      int64 `json:"thoughtsTokenCount"`
	CachedContentTokenCount int64 `json:"cachedContentTokenCount"`
}

func (s *Scanner) usage(obj []byte) {
	var r raw
	if json.Unmarshal(obj, &r) != nil {
		return
	}
	var t Tokens
	if s.key == kUsageMeta {
		t = Tokens{Input: r.PromptTokenCount + r.ToolUsePromptTokenCount, Output: r.CandidatesTokenCount + r.ThoughtsTokenCount,
			CacheRead: r.CachedContentTokenCount}
	} else {
		t = Tokens{
			Input:      r.InputTokens + r.CacheCreation + r.CacheRead + r.PromptTokens,
			Output:     r.OutputTokens + r.CompletionTokens,
			CacheRead:  r.CacheRead + r.InputDetails.CachedTokens + r.PromptDetails.CachedTokens,
			CacheWrite: r.CacheCreation,
		}
	}
	if t == (Tokens{}) && !bytes.Contains(obj, []byte("tokens")) && !bytes.Contains(obj, []byte("TokenCount")) {
		return // an object called usage that is not one
	}
	s.found = true
	if s.Each != nil {
		s.tokens.add(t)
		s.Each(t, s.model)
		return
	}
	s.tokens.max(t)
}

// Result is what the body said so far: the tokens, the model's name, and
// whether any usage was found at all.
func (s *Scanner) Result() (Tokens, string, bool) { return s.tokens, s.model, s.found }
