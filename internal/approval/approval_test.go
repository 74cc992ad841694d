package approval

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

type recs struct {
	mu   sync.Mutex
	list []string
}

func (r *recs) log(kind string, f map[string]any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := kind
	if v, ok := f["reason"].(string); ok {
		s += " " + v
	}
	if v, ok := f["scope"].(string); ok {
		s += " scope=" + v
	}
	r.list = append(r.list, s)
}

func (r *recs) has(sub string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func waitPending(t *testing.T, h *Holder, n int) []Approval {
	t.Helper()
	for i := 0; i < 500; i++ {
		if l := h.List(); len(l) == n {
			return l
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("want %d pending, have %d", n, len(h.List()))
	return nil
}

func TestBoundTimeoutAndAnswers(t *testing.T) {
	var r recs
	timeout := time.Minute
	h := New("sb", r.log, func() (time.Duration, int) { return timeout, 2 })
	ctx := context.Background()
	q := Question{Channel: "network", What: "GET http://a.test/", Rule: "/p.yaml:3:9 network.mode ask", Key: "network tcp a.test 80"}

	res := make(chan Answer, 2)
	go func() { res <- h.Ask(ctx, q) }()
	go func() { res <- h.Ask(ctx, q) }()
	l := waitPending(t, h, 2)
	if l[0].Source != "/p.yaml:3:9" || l[0].State != Pending || l[0].Sandbox != "sb" {
		t.Fatalf("%+v", l[0])
	}
	// Over the bound: refused at once, on the record, never held.
	start := time.Now()
	if a := h.Ask(ctx, q); a.Allow || !strings.Contains(a.Reason, "ask.max") || time.Since(start) > time.Second {
		t.Fatalf("third question: %+v", a)
	}
	if !r.has("approval.denied 2 questions already wait") {
		t.Fatalf("no record of the refusal: %v", r.list)
	}
	if _, err := h.Answer(l[0].ID, "maybe", "test", nil); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad decision: %v", err)
	}
	if _, err := h.Answer(l[0].ID, Once, "test", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Answer(l[0].ID, Once, "test", nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("answered twice: %v", err)
	}
	if a := <-res; !a.Allow || a.Decision != Once {
		t.Fatalf("%+v", a)
	}
	// Once grants nothing further.
	if _, ok := h.Granted(q.Key); ok {
		t.Fatal("once made a grant")
	}
	if _, err := h.Answer(l[1].ID, Sandbox, "test", nil); err != nil {
		t.Fatal(err)
	}
	if a := <-res; !a.Allow || a.Decision != Sandbox {
		t.Fatalf("%+v", a)
	}
	if a := h.Ask(ctx, q); !a.Allow || a.Decision != Sandbox {
		t.Fatalf("after a sandbox grant: %+v", a)
	}

	// Timeout: refused as if denied, recorded.
	timeout = 50 * time.Millisecond
	q2 := Question{Channel: "git", What: "push refs/heads/main (fast-forward) to x/y/z", Key: "git push x/y/z refs/heads/main"}
	if a := h.Ask(ctx, q2); a.Allow || !strings.Contains(a.Reason, "no answer within ask.timeout") {
		t.Fatalf("timeout: %+v", a)
	}
	if !r.has("approval.timeout") || len(h.List()) != 0 {
		t.Fatalf("after timeout: %v %v", r.list, h.List())
	}
	// The request going away ends the question too.
	timeout = time.Minute
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan Answer, 1)
	go func() { done <- h.Ask(cctx, q2) }()
	waitPending(t, h, 1)
	cancel()
	if a := <-done; a.Allow {
		t.Fatalf("%+v", a)
	}
	if len(h.List()) != 0 {
		t.Fatal("question left behind")
	}
	// Deny.
	go func() { done <- h.Ask(ctx, q2) }()
	l = waitPending(t, h, 1)
	h.Answer(l[0].ID, Deny, "cli (u)", nil)
	if a := <-done; a.Allow || !strings.Contains(a.Reason, "denied it (cli (u))") {
		t.Fatalf("%+v", a)
	}
	if !r.has("approval.granted scope=once") || !r.has("approval.granted scope=sandbox") {
		t.Fatalf("%v", r.list)
	}
}

// Always grants the question's key for the sandbox's life, unless the rule
// it writes is narrower than the key (a file path asked under a rule for
// many): then the written rule is all it grants.
func TestAlwaysNarrow(t *testing.T) {
	var r recs
	h := New("sb", r.log, func() (time.Duration, int) { return time.Minute, 4 })
	ctx := context.Background()
	for _, narrow := range []bool{false, true} {
		q := Question{Channel: "file", What: "write /work/a", Key: "file rw files.rules[0] ask-write /work/**", Narrow: narrow}
		if narrow {
			q.Key += " (narrow)"
		}
		res := make(chan Answer, 1)
		go func() { res <- h.Ask(ctx, q) }()
		l := waitPending(t, h, 1)
		if _, err := h.Answer(l[0].ID, Always, "test", nil); err != nil {
			t.Fatal(err)
		}
		if a := <-res; !a.Allow || a.Decision != Always {
			t.Fatalf("%+v", a)
		}
		if _, ok := h.Granted(q.Key); ok == narrow {
			t.Fatalf("narrow %v: key granted %v", narrow, ok)
		}
	}
}

// A grant for the sandbox's life answers the other questions waiting for
// the same key (on the record, each naming the answer that covered it);
// a question about something else stays.
func TestSandboxGrantReleasesSameKey(t *testing.T) {
	var r recs
	h := New("sb", r.log, func() (time.Duration, int) { return time.Minute, 8 })
	ctx := context.Background()
	q := Question{Channel: "credential", What: "POST https://api.test/v1/messages past its budget", Key: "budget model"}
	other := Question{Channel: "network", What: "GET http://b.test/", Key: "network tcp b.test 80"}
	res := make(chan Answer, 3)
	for range 3 {
		go func() { res <- h.Ask(ctx, q) }()
	}
	otherRes := make(chan Answer, 1)
	go func() { otherRes <- h.Ask(ctx, other) }()
	l := waitPending(t, h, 4)
	var id string
	for _, a := range l {
		if a.Key == q.Key {
			id = a.ID
			break
		}
	}
	if _, err := h.Answer(id, Sandbox, "cli (u)", nil); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case a := <-res:
			if !a.Allow || a.Decision != Sandbox {
				t.Fatalf("%+v", a)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a question for the same key still holds its request after a sandbox grant")
		}
	}
	if l := h.List(); len(l) != 1 || l[0].Key != other.Key {
		t.Fatalf("pending after the grant: %+v", l)
	}
	n := 0
	r.mu.Lock()
	for _, s := range r.list {
		if strings.HasPrefix(s, "approval.granted") && strings.Contains(s, "scope=sandbox") {
			n++
		}
	}
	r.mu.Unlock()
	if n != 3 {
		t.Fatalf("%d approval.granted records, want 3 (one per question): %v", n, r.list)
	}
}
