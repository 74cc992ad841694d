package netstack

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/usage"
)

// The usage rig: three model APIs behind one scripted upstream, each with
// a credential and a budget, answering with the providers' own usage
// shapes (internal/usage/testdata), streamed when the request says
// "stream": true or asks for :streamGenerateContent.
const usageProfile = `
network:
  mode: default-deny
  allow:
    - domain: "*.model.test"
      ports: [443]
credentials:
  - name: claude
    from: api-key
    domain: anthropic.model.test
    header: x-api-key
    budget: {requests: 3}
  - name: codex
    from: api-key
    domain: openai.model.test
    header: Authorization
    format: "Bearer {}"
    budget: {tokens: 3000}
  - name: gem
    from: api-key
    domain: gemini.model.test
    header: x-goog-api-key
    budget: {tokens: 1000, per: day}
  - name: free
    from: api-key
    domain: free.model.test
    header: x-api-key
`

const usageHosts = `
203.0.113.21 anthropic.model.test
203.0.113.22 openai.model.test
203.0.113.23 gemini.model.test
203.0.113.24 free.model.test
`

// scriptedModel is the upstream. It answers from the fixtures, honours
// Accept-Encoding: gzip (so a gateway that passed the guest's on would
// get gzip), gzips /stubborn/ paths whatever was asked, and holds a
// streamed answer after its first event until release is closed (when
// set).
type scriptedModel struct {
	mu       sync.Mutex
	requests map[string]int // path → count
	encs     []string       // Accept-Encoding seen
	keys     []string
	release  chan struct{}
}

func fixture(t testing.TB, name string) []byte {
	b, err := os.ReadFile(filepath.Join("..", "usage", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (m *scriptedModel) handler(t testing.TB) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m.mu.Lock()
		m.requests[r.URL.Path]++
		m.encs = append(m.encs, r.Header.Get("Accept-Encoding"))
		m.keys = append(m.keys, r.Header.Get("X-Api-Key")+r.Header.Get("Authorization")+r.Header.Get("X-Goog-Api-Key"))
		release := m.release
		m.mu.Unlock()
		path := strings.TrimPrefix(r.URL.Path, "/stubborn")
		stream := bytes.Contains(body, []byte(`"stream":true`)) || strings.HasSuffix(path, ":streamGenerateContent")
		var name string
		switch {
		case path == "/v1/messages":
			name = "anthropic"
		case path == "/v1/responses":
			name = "responses"
		case path == "/v1/chat/completions":
			name = "chat"
		case strings.Contains(path, "Content"):
			name = "gemini"
		default:
			w.Write([]byte(`{"data":[]}`))
			return
		}
		ext := ".json"
		if stream {
			ext = ".sse"
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		out := fixture(t, name+ext)
		if name == "chat" && stream && !bytes.Contains(body, []byte(`"include_usage":true`)) {
			// As OpenAI does: no usage chunk unless the request asks.
			i := bytes.Index(out, []byte(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-2024-08-06","choices":[],"usage"`))
			out = append(out[:i:i], []byte("data: [DONE]\n\n")...)
		}
		if strings.HasPrefix(r.URL.Path, "/stubborn/") || strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			gz.Write(out)
			gz.Close()
			return
		}
		if stream && release != nil {
			i := bytes.Index(out, []byte("\n\n")) + 2
			w.Write(out[:i])
			w.(http.Flusher).Flush()
			<-release
			out = out[i:]
		}
		w.Write(out)
	})
}

func (m *scriptedModel) count(path string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests[path]
}

type usageRig struct {
	*rig
	model *scriptedModel
	roots *x509.CertPool
}

func newUsageRig(t testing.TB, meter *usage.Meter) *usageRig {
	t.Helper()
	return newUsageRigWith(t, meter, nil)
}

// newUsageRigWith is newUsageRig with h as the upstream instead of the
// scripted model.
func newUsageRigWith(t testing.TB, meter *usage.Meter, h http.Handler) *usageRig {
	t.Helper()
	return newUsageRigProfile(t, meter, h, usageProfile)
}

// newUsageRigProfile is newUsageRigWith on profile src (usageProfile's
// names and credentials, changed), with more Config options.
func newUsageRigProfile(t testing.TB, meter *usage.Meter, h http.Handler, src string, opts ...rigOpt) *usageRig {
	t.Helper()
	m := &scriptedModel{requests: map[string]int{}}
	if h == nil {
		h = m.handler(t)
	}
	addr, upRoots := upstreamTLS(t, "*.model.test", h)
	prof := mustProfile(t, src)
	hosts, err := ParseHosts(strings.NewReader(usageHosts), "hosts")
	if err != nil {
		t.Fatal(err)
	}
	r, ca := inspectRig(t, append([]rigOpt{func(c *Config) {
		c.Policy = ProfilePolicy(prof)
		c.Credentials = ProfileCredentials(prof)
		c.Resolver = hosts
		c.UpstreamRoots = upRoots
		c.Meter = meter
	}}, opts...)...)
	for i := 21; i <= 24; i++ {
		r.route("tcp", fmt.Sprintf("203.0.113.%d:443", i), addr)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	return &usageRig{rig: r, model: m, roots: roots}
}

// client is a guest HTTPS client for host (one of usageHosts' names).
func (u *usageRig) client(t testing.TB, host string) *http.Client {
	t.Helper()
	if m, err := u.query(host, dns.TypeA, false); err != nil || m.Rcode != dns.RcodeSuccess {
		t.Fatalf("resolve %s: %v, %v", host, m, err)
	}
	ip := ""
	for _, l := range strings.Split(usageHosts, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[1] == host {
			ip = f[0]
		}
	}
	cl := u.guestHTTPS(ip+":443", u.roots)
	cl.Transport.(*http.Transport).DisableCompression = true // the guest asks for gzip itself, below
	t.Cleanup(cl.CloseIdleConnections)
	return cl
}

// post sends a model request as the guest and returns the answer.
func post(t *testing.T, cl *http.Client, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept-Encoding", "gzip, deflate, br") // what Node's fetch sends
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// usageEvents are the cred.usage events for credential so far.
func (u *usageRig) usageEvents(cred string) []Event {
	var out []Event
	for _, e := range u.eventsSnapshot() {
		if e.Kind == audit.KindCredUsage && e.Credential == cred {
			out = append(out, e)
		}
	}
	return out
}

func (u *usageRig) waitUsage(t *testing.T, cred string, n int) Event {
	t.Helper()
	u.waitEvent(fmt.Sprintf("%d cred.usage for %s", n, cred), func(Event) bool { return len(u.usageEvents(cred)) >= n })
	ev := u.usageEvents(cred)
	return ev[n-1]
}

// Each provider's answer, streamed and not, passes to the guest
// unchanged and gives one cred.usage record with the tokens it reported;
// the guest's Accept-Encoding never reaches upstream.
func TestBrokerUsage(t *testing.T) {
	meter, _ := usage.NewMeter("", nil)
	u := newUsageRig(t, meter)
	want := func(name string) []byte { return fixture(t, name) }
	for i, tc := range []struct {
		cred, host, path, body, fixture, model string
	}{
		{"claude", "anthropic.model.test", "/v1/messages", `{"model":"x"}`, "anthropic.json", "claude-sonnet-4-5"},
		{"claude", "anthropic.model.test", "/v1/messages", `{"model":"x","stream":true}`, "anthropic.sse", "claude-sonnet-4-5"},
		{"codex", "openai.model.test", "/v1/responses", `{}`, "responses.json", "gpt-5-codex"},
		// The guest turns usage off; the gateway turns it back on.
		{"codex", "openai.model.test", "/v1/chat/completions", `{"stream":true,"stream_options":{"include_usage":false}}`, "chat.sse", "gpt-4o-2024-08-06"},
		{"free", "free.model.test", "/v1/chat/completions", `{}`, "chat.json", "gpt-4o-2024-08-06"},
		{"free", "free.model.test", "/v1/responses", `{"stream":true}`, "responses.sse", "gpt-5-codex"},
		{"free", "free.model.test", "/v1beta/models/gemini-2.5-pro:generateContent", `{}`, "gemini.json", "gemini-2.5-pro"},
		{"gem", "gemini.model.test", "/v1beta/models/gemini-2.5-pro:streamGenerateContent", `{}`, "gemini.sse", "gemini-2.5-pro"},
	} {
		cl := u.client(t, tc.host)
		resp, b := post(t, cl, "https://"+tc.host+tc.path, tc.body)
		if resp.StatusCode != 200 || !bytes.Equal(b, want(tc.fixture)) || resp.Header.Get("Content-Encoding") != "" {
			t.Fatalf("%s: %s %q, body changed on the way: %q", tc.fixture, resp.Status, resp.Header.Get("Content-Encoding"), b)
		}
		e := u.waitEvent(tc.fixture+" cred.usage", func(e Event) bool {
			return e.Kind == audit.KindCredUsage && e.Credential == tc.cred && e.Path == tc.path && e.Usage.Model == tc.model &&
				countUsage(u.eventsSnapshot()) > i
		})
		f := e.Fields()
		wantTokens := usage.Tokens{Input: 1150, Output: 42, CacheRead: 1000}
		if strings.HasPrefix(tc.fixture, "anthropic") {
			wantTokens.CacheWrite = 30
		}
		if e.Usage.Tokens != wantTokens || !e.Usage.Found || f["input_tokens"] != int64(1150) || f["output_tokens"] != int64(42) ||
			f["model"] != tc.model || f["status"] != 200 || f["credential"] != tc.cred {
			t.Errorf("%s: cred.usage %v", tc.fixture, f)
		}
	}
	if got := u.usageEvents("claude")[1].Fields(); got["provider"] != "anthropic" || got["total_requests"] != int64(2) || got["total_tokens"] != int64(2*1192) {
		t.Errorf("running totals after two Anthropic requests: %v", got)
	}
	if got := u.usageEvents("gem")[0].Fields(); got["provider"] != "gemini" || got["day_tokens"] != int64(1192) {
		t.Errorf("gemini: %v", got)
	}
	u.model.mu.Lock()
	for _, e := range u.model.encs {
		if e != "identity" {
			t.Errorf("upstream was asked for Accept-Encoding %q: it must be identity so the gateway can read usage", e)
		}
	}
	for _, k := range u.model.keys {
		if k != testSecret && k != "Bearer "+testSecret {
			t.Errorf("upstream saw key %q", k)
		}
	}
	u.model.mu.Unlock()
	// A request that is not a model call and says nothing of usage has
	// no cred.usage record.
	before := countUsage(u.eventsSnapshot())
	cl := u.client(t, "free.model.test")
	if resp, err := cl.Get("https://free.model.test/v1/models"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	cl.CloseIdleConnections()
	u.waitEvent("flow end", func(e Event) bool { return e.Kind == audit.KindNetFlow && e.Credential == "free" })
	if countUsage(u.eventsSnapshot()) != before {
		t.Error("GET /v1/models made a cred.usage record")
	}
}

func countUsage(evs []Event) int {
	n := 0
	for _, e := range evs {
		if e.Kind == audit.KindCredUsage {
			n++
		}
	}
	return n
}

// A streamed answer is not held back while its usage is read: the
// guest has the first event while the upstream still holds the rest.
func TestBrokerUsageStreams(t *testing.T) {
	u := newUsageRig(t, nil)
	u.model.release = make(chan struct{})
	cl := u.client(t, "anthropic.model.test")
	req, _ := http.NewRequest("POST", "https://anthropic.model.test/v1/messages", strings.NewReader(`{"stream":true}`))
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	got := make(chan string, 1)
	go func() { l, _ := rd.ReadString('\n'); got <- l }()
	select {
	case l := <-got:
		if l != "event: message_start\n" {
			t.Errorf("first line %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the first event was held back")
	}
	if len(u.usageEvents("claude")) != 0 {
		t.Error("usage recorded before the answer ended")
	}
	close(u.model.release)
	if rest, err := io.ReadAll(rd); err != nil || !bytes.HasSuffix(rest, []byte("message_stop\"}\n\n")) {
		t.Fatalf("rest of the stream: %v, %q", err, rest)
	}
	if e := u.waitUsage(t, "claude", 1); e.Usage.Tokens.Output != 42 || e.Usage.Tokens.Input != 1150 {
		t.Errorf("streamed usage %+v", e.Usage)
	}
}

// Past a budget the next request is answered with the provider's own
// quota error, never reaches upstream, and is recorded as a refusal
// naming the budget; the count survives a new gateway on the same meter
// file (a restarted supervisor).
func TestBrokerBudget(t *testing.T) {
	meterFile := filepath.Join(t.TempDir(), "usage.json")
	meter, err := usage.NewMeter(meterFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	u := newUsageRig(t, meter)

	// claude: 3 requests, streamed or not, on one connection or several.
	cl := u.client(t, "anthropic.model.test")
	post(t, cl, "https://anthropic.model.test/v1/messages", `{}`)
	post(t, cl, "https://anthropic.model.test/v1/messages", `{"stream":true}`)
	post(t, u.client(t, "anthropic.model.test"), "https://anthropic.model.test/stubborn/v1/messages", `{}`)
	resp, b := post(t, cl, "https://anthropic.model.test/v1/messages", `{"stream":true}`)
	var ae struct {
		Type  string
		Error struct{ Type, Message string }
	}
	json.Unmarshal(b, &ae)
	if resp.StatusCode != 402 || ae.Type != "error" || ae.Error.Type != "billing_error" || resp.Header.Get("X-Should-Retry") != "false" ||
		!strings.Contains(ae.Error.Message, "credential claude has used 3 of its budget of 3 requests in this sandbox") ||
		!strings.Contains(ae.Error.Message, "test.yaml:") || !strings.Contains(ae.Error.Message, "smx agent policy") {
		t.Fatalf("past the request budget: %s %s", resp.Status, b)
	}
	if n := u.model.count("/v1/messages") + u.model.count("/stubborn/v1/messages"); n != 3 {
		t.Fatalf("upstream got %d requests, want 3: the refused one went on", n)
	}
	e := refusedWith(u.rig, "test.yaml:8:5 credentials claude.budget")
	if f := e.Fields(); f["provider"] != "anthropic" || f["credential"] != "claude" || f["path"] != "/v1/messages" ||
		!strings.Contains(fmt.Sprint(f["reason"]), "3 of its budget of 3 requests") {
		t.Errorf("refusal %v", f)
	}
	// The stubbornly gzipped answer was read (and reached the guest plain).
	if e := u.waitUsage(t, "claude", 3); e.Usage.Tokens.Output != 42 {
		t.Errorf("gzipped answer's usage %+v", e.Usage)
	}

	// codex: 3000 tokens; each answer reports 1192.
	oc := u.client(t, "openai.model.test")
	for i := range 3 {
		if resp, b := post(t, oc, "https://openai.model.test/v1/responses", `{"stream":true}`); resp.StatusCode != 200 {
			t.Fatalf("under the token budget: %s %s", resp.Status, b)
		}
		u.waitUsage(t, "codex", i+1)
	}
	resp, b = post(t, oc, "https://openai.model.test/v1/chat/completions", `{}`)
	var oe struct {
		Error struct{ Message, Type, Code string }
	}
	json.Unmarshal(b, &oe)
	if resp.StatusCode != 429 || oe.Error.Code != "insufficient_quota" || oe.Error.Type != "insufficient_quota" ||
		!strings.Contains(oe.Error.Message, "3576 of its budget of 3000 tokens") {
		t.Fatalf("past the token budget: %s %s", resp.Status, b)
	}
	if u.model.count("/v1/chat/completions") != 0 {
		t.Fatal("the request past the token budget reached upstream")
	}

	// gem: 1000 tokens a day; the first answer crosses it.
	gc := u.client(t, "gemini.model.test")
	post(t, gc, "https://gemini.model.test/v1beta/models/gemini-2.5-pro:generateContent", `{}`)
	u.waitUsage(t, "gem", 1)
	resp, b = post(t, gc, "https://gemini.model.test/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", `{}`)
	var ge struct {
		Error struct {
			Code            int
			Message, Status string
		}
	}
	json.Unmarshal(b, &ge)
	if resp.StatusCode != 429 || ge.Error.Code != 429 || ge.Error.Status != "RESOURCE_EXHAUSTED" || !strings.Contains(ge.Error.Message, "today (UTC)") {
		t.Fatalf("past the daily budget: %s %s", resp.Status, b)
	}

	// A restarted gateway on the same meter file carries on from it.
	meter2, err := usage.NewMeter(meterFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	u2 := newUsageRig(t, meter2)
	if resp, b := post(t, u2.client(t, "anthropic.model.test"), "https://anthropic.model.test/v1/messages", `{}`); resp.StatusCode != 402 {
		t.Fatalf("after a restart: %s %s", resp.Status, b)
	}
	if u2.model.count("/v1/messages") != 0 {
		t.Fatal("after a restart the spent budget let a request through")
	}
	// The free credential has no budget and is never refused.
	for range 4 {
		if resp, _ := post(t, u2.client(t, "free.model.test"), "https://free.model.test/v1/messages", `{}`); resp.StatusCode != 200 {
			t.Fatalf("credential without budget: %s", resp.Status)
		}
	}
}

// Racing the last requests of a budget over parallel connections lets
// exactly the budget through; a guest offering only HTTP/2 gets no
// connection at all (the gateway speaks HTTP/1.1, which it reads).
func TestBrokerBudgetAdversarial(t *testing.T) {
	u := newUsageRig(t, nil)
	u.resolve(t, "anthropic.model.test")
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := u.guestHTTPS("203.0.113.21:443", u.roots)
			defer cl.CloseIdleConnections()
			req, _ := http.NewRequest("POST", "https://anthropic.model.test/v1/messages", strings.NewReader(`{}`))
			resp, err := cl.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case 200:
				ok.Add(1)
			case 402:
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 3 || refused.Load() != 5 || u.model.count("/v1/messages") != 3 {
		t.Fatalf("8 parallel requests under a budget of 3: %d passed, %d refused, upstream saw %d", ok.Load(), refused.Load(), u.model.count("/v1/messages"))
	}

	h2 := &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return u.dialTCP(ctx, "203.0.113.21:443") },
		TLSClientConfig:   &tls.Config{RootCAs: u.roots, NextProtos: []string{"h2"}},
		ForceAttemptHTTP2: true,
	}, Timeout: 10 * time.Second}
	if resp, err := h2.Post("https://anthropic.model.test/v1/messages", "application/json", strings.NewReader(`{}`)); err == nil {
		resp.Body.Close()
		if resp.ProtoMajor == 2 {
			t.Fatal("the gateway spoke HTTP/2 to the guest")
		}
	}
	if u.model.count("/v1/messages") != 3 {
		t.Fatal("an HTTP/2 request reached upstream past the budget")
	}
}

// wsServerFrame is one unmasked server text frame.
func wsServerFrame(payload []byte) []byte {
	f := []byte{0x81}
	switch n := len(payload); {
	case n < 126:
		f = append(f, byte(n))
	default:
		f = append(f, 126, byte(n>>8), byte(n))
	}
	return append(f, payload...)
}

// A Responses session over WebSocket is metered answer by answer: each
// response.completed is a request with its usage; the session that
// spends the budget is ended, and the next upgrade is refused with
// OpenAI's quota error. The upgrade offers upstream no compression.
func TestBrokerBudgetWebSocket(t *testing.T) {
	var exts atomic.Value
	exts.Store("unset")
	completed := bytes.TrimSpace(bytes.SplitN(bytes.SplitN(fixture(t, "responses.sse"), []byte("event: response.completed\ndata: "), 2)[1], []byte("\n"), 2)[0])
	created := []byte(`{"type":"response.created","response":{"id":"r","model":"gpt-5-codex","usage":null}}`)
	var upgrades atomic.Int64
	u := newUsageRigWith(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "no", 400)
			return
		}
		upgrades.Add(1)
		exts.Store(r.Header.Get("Sec-WebSocket-Extensions"))
		c, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n")
		for range 5 { // five answers, as if to five requests
			brw.Write(wsServerFrame(created))
			brw.Write(wsServerFrame(completed))
			brw.Flush()
			time.Sleep(50 * time.Millisecond)
		}
		io.Copy(io.Discard, brw)
	}))
	u.resolve(t, "openai.model.test")
	upgrade := func() (*http.Response, *bufio.Reader, net.Conn) {
		c, err := u.dialTCP(ctxT(t), "203.0.113.22:443")
		if err != nil {
			t.Fatal(err)
		}
		tc := tls.Client(c, &tls.Config{ServerName: "openai.model.test", RootCAs: u.roots})
		io.WriteString(tc, "GET /v1/responses HTTP/1.1\r\nHost: openai.model.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"+
			"Authorization: Bearer smx-placeholder\r\n\r\n")
		br := bufio.NewReader(tc)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		return resp, br, tc
	}
	resp, br, tc := upgrade()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %s", resp.Status)
	}
	// The budget is 3000 tokens, each answer 1192: the third crosses it
	// and the session ends there.
	tc.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.ReadAll(br)
	tc.Close()
	if n := bytes.Count(got, []byte(`"response.completed"`)); n != 3 || err != nil && !strings.Contains(err.Error(), "EOF") {
		t.Fatalf("the guest got %d answers before the session ended (%v), want 3", n, err)
	}
	if e := exts.Load(); e != "" {
		t.Errorf("upstream was offered Sec-WebSocket-Extensions %q", e)
	}
	u.waitUsage(t, "codex", 3)
	ev := u.usageEvents("codex")
	if f := ev[2].Fields(); f["total_requests"] != int64(3) || f["total_tokens"] != int64(3*1192) || f["model"] != "gpt-5-codex" {
		t.Errorf("third answer %v", f)
	}
	refusedWith(u.rig, "test.yaml:13:5 credentials codex.budget")
	// The next upgrade, and a POST, are refused without reaching upstream.
	resp, _, tc = upgrade()
	tc.Close()
	if resp.StatusCode != 429 || upgrades.Load() != 1 {
		t.Fatalf("upgrade past the budget: %s, upstream saw %d upgrades", resp.Status, upgrades.Load())
	}
	if resp, b := post(t, u.client(t, "openai.model.test"), "https://openai.model.test/v1/responses", `{}`); resp.StatusCode != 429 ||
		!strings.Contains(string(b), "insufficient_quota") {
		t.Fatalf("POST past the budget: %s %s", resp.Status, b)
	}
}
