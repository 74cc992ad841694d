// Package approval holds the questions a sandbox's gateways put to the
// host user when a rule says ask (policy.Decision.Ask). One Holder lives in
// each sandbox's supervisor: a gateway calls Ask, which blocks the calling
// goroutine (the one that already serves the request; nothing else is
// started) until the host user answers through the service's broker
// (internal/service: CLI, API, MCP, console), the question times out, or the
// request goes away. The number of questions held at once is bounded; a
// question over the bound is refused at once, on the record.
//
// Answers: deny, once (this request only), sandbox (the same key for the
// rest of the supervisor's life, kept in memory here) and always (the
// service has written a rule into the profile file and reloaded it before
// it answers; here it counts as a grant of the same key).
//
// The Holder is reached only through the supervisor's control socket,
// which the guest cannot reach: nothing inside the sandbox can answer.
package approval

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/errdefs"
)

// States and decisions (the wire's; see package api).
const (
	Pending = "pending"
	Granted = "granted"
	Denied  = "denied"
	Timeout = "timeout"

	Deny    = "deny"
	Once    = "once"
	Sandbox = "sandbox"
	Always  = "always"
)

// Audit record kinds.
const (
	KindRequested = audit.KindApprovalRequested
	KindGranted   = audit.KindApprovalGranted
	KindDenied    = audit.KindApprovalDenied
	KindTimeout   = audit.KindApprovalTimeout
)

// Approval is one question: the wire's Approval plus what the service
// needs to write an `always` rule (Suggest). Key is what a sandbox-scope
// grant matches.
type Approval struct {
	ID       string    `json:"id"`
	Sandbox  string    `json:"sandbox"`
	Channel  string    `json:"channel"`
	What     string    `json:"what"`
	Rule     string    `json:"rule"`
	Source   string    `json:"source,omitempty"`
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires"`
	State    string    `json:"state"`
	Decision string    `json:"decision,omitempty"`
	By       string    `json:"by,omitempty"`
	// RuleWritten and ProfileFile: for always, the rule the service wrote
	// into the profile file.
	RuleWritten string `json:"rule_written,omitempty"`
	ProfileFile string `json:"profile_file,omitempty"`

	// Key identifies what was asked for grants of scope sandbox (e.g.
	// "network tcp packages.example.test 443").
	Key string `json:"key,omitempty"`
	// Suggest is the rule an `always` answer writes: the profile section
	// (e.g. "network.allow") and the rule as a YAML mapping.
	Suggest *Rule `json:"suggest,omitempty"`
}

// Rule is a profile rule to add: Section is a dotted path to a list
// ("network.allow", "ssh.allow", "files.rules") and Fields its mapping, in
// order. For a Git ref rule Section is "git.repos" and Repo names the
// repository entry the ref goes under.
type Rule struct {
	Section string      `json:"section"`
	Fields  [][2]string `json:"fields"`
	Repo    string      `json:"repo,omitempty"`
}

// Question is what a gateway asks.
type Question struct {
	Channel string // network, file, git, ssh, credential
	What    string
	Rule    string // the decision's rule label ("FILE:L:C section[i] ...")
	Key     string
	Suggest *Rule
	// Narrow says Suggest is narrower than Key (a file rule for one path,
	// asked under a rule for many): an always answer then grants only the
	// rule it wrote, not Key for the sandbox's life.
	Narrow bool
}

// Answer is the outcome of Ask.
type Answer struct {
	Allow    bool
	Decision string // once, sandbox, always, deny; "" on timeout or refusal
	ID       string
	By       string
	Reason   string // why, when refused
}

// Holder keeps one sandbox's questions. The zero value is not usable; see
// New.
type Holder struct {
	sandbox string
	log     func(kind string, fields map[string]any)
	limits  func() (time.Duration, int) // the current profile's ask.timeout and ask.max

	mu      sync.Mutex
	pending map[string]*held
	grants  map[string]string // key → approval id (scope sandbox or always)
	changed chan struct{}     // closed and replaced on every change (Watch)
}

type held struct {
	a      Approval
	narrow bool        // Question.Narrow
	done   chan Answer // buffered 1
}

// New returns a Holder for sandbox. log writes an audit record; limits
// returns the timeout and the bound in force.
func New(sandbox string, log func(kind string, fields map[string]any), limits func() (time.Duration, int)) *Holder {
	return &Holder{sandbox: sandbox, log: log, limits: limits, pending: map[string]*held{}, grants: map[string]string{}, changed: make(chan struct{})}
}

// Granted reports whether key was granted for the sandbox's life, and by
// which approval.
func (h *Holder) Granted(key string) (string, bool) {
	if h == nil || key == "" {
		return "", false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	id, ok := h.grants[key]
	return id, ok
}

func newID() string {
	var b [6]byte
	rand.Read(b[:])
	return "ap-" + hex.EncodeToString(b[:])
}

func (h *Holder) notify() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// Changed returns a channel closed at the next change of the pending set.
func (h *Holder) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

func (h *Holder) fields(a *Approval) map[string]any {
	m := map[string]any{"id": a.ID, "channel": a.Channel, "what": a.What, "rule": a.Rule}
	if a.Source != "" {
		m["source"] = a.Source
	}
	return m
}

// Ask holds the caller until q is answered, times out, or ctx ends, and
// records the question and its outcome. It blocks only the calling
// goroutine.
func (h *Holder) Ask(ctx context.Context, q Question) Answer {
	timeout, max := h.limits()
	now := time.Now()
	a := Approval{ID: newID(), Sandbox: h.sandbox, Channel: q.Channel, What: q.What, Rule: q.Rule, Source: SourceOf(q.Rule),
		Created: now.UTC(), Expires: now.Add(timeout).UTC(), State: Pending, Key: q.Key, Suggest: q.Suggest}
	h.mu.Lock()
	if id, ok := h.grants[q.Key]; ok && q.Key != "" {
		h.mu.Unlock()
		return Answer{Allow: true, Decision: Sandbox, ID: id}
	}
	if len(h.pending) >= max {
		h.mu.Unlock()
		f := h.fields(&a)
		f["refused"] = true
		f["reason"] = fmt.Sprintf("%d questions already wait for the host user (ask.max); refused without asking", max)
		h.log(KindDenied, f)
		return Answer{ID: a.ID, Reason: f["reason"].(string)}
	}
	w := &held{a: a, narrow: q.Narrow, done: make(chan Answer, 1)}
	h.pending[a.ID] = w
	h.notify()
	h.mu.Unlock()
	f := h.fields(&a)
	f["expires"] = a.Expires.Format(time.RFC3339)
	h.log(KindRequested, f)

	t := time.NewTimer(timeout)
	defer t.Stop()
	var ans Answer
	select {
	case ans = <-w.done:
		return ans // recorded by Answer
	case <-t.C:
		ans = Answer{ID: a.ID, Reason: "no answer within ask.timeout " + timeout.String() + "; refused as if denied"}
	case <-ctx.Done():
		ans = Answer{ID: a.ID, Reason: "the request went away while it waited"}
	}
	h.mu.Lock()
	_, still := h.pending[a.ID]
	delete(h.pending, a.ID)
	h.notify()
	h.mu.Unlock()
	if !still {
		// Answered in the same instant: the answer wins.
		return <-w.done
	}
	f = h.fields(&a)
	f["refused"] = true
	f["reason"] = ans.Reason
	h.log(KindTimeout, f)
	return ans
}

// List returns the pending questions, oldest first.
func (h *Holder) List() []Approval {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]Approval, 0, len(h.pending))
	for _, w := range h.pending {
		out = append(out, w.a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Get returns a pending question.
func (h *Holder) Get(id string) (Approval, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	w, ok := h.pending[id]
	if !ok {
		return Approval{}, false
	}
	return w.a, true
}

// Answer answers a pending question and releases the request it holds.
// by says who answered through which interface; extra fields go into the
// record (for always: the rule written and the file).
func (h *Holder) Answer(id, decision, by string, extra map[string]any) (Approval, error) {
	switch decision {
	case Deny, Once, Sandbox, Always:
	default:
		return Approval{}, fmt.Errorf("decision %q: want deny, once, sandbox or always: %w", decision, errdefs.ErrInvalid)
	}
	h.mu.Lock()
	w, ok := h.pending[id]
	if !ok {
		h.mu.Unlock()
		return Approval{}, fmt.Errorf("approval %s is not pending in sandbox %s (answered, timed out, or unknown): %w", id, h.sandbox, errdefs.ErrNotFound)
	}
	delete(h.pending, id)
	// A grant for the sandbox's life also answers the questions already
	// waiting for the same thing (parallel requests to one host, past one
	// budget): left pending, they would hold their requests until the
	// timeout refused them.
	var same []*held
	if (decision == Sandbox || decision == Always && !w.narrow) && w.a.Key != "" {
		h.grants[w.a.Key] = id
		for oid, o := range h.pending {
			if o.a.Key == w.a.Key {
				delete(h.pending, oid)
				same = append(same, o)
			}
		}
	}
	h.notify()
	h.mu.Unlock()
	for _, o := range same {
		f := h.fields(&o.a)
		f["by"], f["scope"], f["granted_with"] = by, decision, id
		for k, v := range extra {
			f[k] = v
		}
		h.log(KindGranted, f)
		o.done <- Answer{Allow: true, ID: o.a.ID, By: by, Decision: decision}
	}
	a := w.a
	a.Decision, a.By = decision, by
	f := h.fields(&a)
	f["by"] = by
	ans := Answer{ID: id, By: by, Decision: decision}
	if decision == Deny {
		a.State = Denied
		f["refused"] = true
		ans.Reason = "the host user denied it (" + by + ")"
		h.log(KindDenied, f)
	} else {
		a.State = Granted
		ans.Allow = true
		f["scope"] = decision
		for k, v := range extra {
			f[k] = v
		}
		h.log(KindGranted, f)
	}
	w.done <- ans
	return a, nil
}

// SourceOf is the "FILE:LINE:COL" that starts a rule label, or "".
func SourceOf(rule string) string {
	for i := 0; i < len(rule); i++ {
		if rule[i] == ' ' {
			s := rule[:i]
			if n := colons(s); n >= 2 {
				return s
			}
			return ""
		}
	}
	return ""
}

func colons(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] == ':' {
			n++
		}
	}
	return n
}
