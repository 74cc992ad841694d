package usage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/policy"
)

// Spent is one credential's running total in one sandbox: over the
// sandbox's life, and for the UTC day named by Day.
type Spent struct {
	Requests int64 `json:"requests"`
	Tokens
	Day         string `json:"day,omitempty"` // YYYY-MM-DD, UTC
	DayRequests int64  `json:"day_requests,omitempty"`
	DayTokens   int64  `json:"day_tokens,omitempty"` // input + output
}

// Meter keeps the running totals of one sandbox's credentials and, when
// Path is set, writes them there (a small JSON file, rewritten in place),
// so that a restarted supervisor carries on from them. The totals of a
// credential with a budget are written on every change, so a cap holds
// exactly across a restart; the others at most flushDelay later (they
// are shown, not enforced; the audit log holds every request), which
// spares small model requests two file writes each. Close writes what
// is pending. Safe for concurrent use.
type Meter struct {
	mu      sync.Mutex
	path    string
	f       *os.File // path, open for writing; nil until the first save
	size    int      // bytes last written to f
	now     func() time.Time
	spent   map[string]*Spent
	capped  map[string]bool // credentials admitted under a budget: written through
	dirty   bool            // a change not yet written
	pending *time.Timer     // the deferred write, while one is scheduled
}

// flushDelay bounds how long a change to an uncapped credential's totals
// waits to be written.
const flushDelay = 100 * time.Millisecond

// NewMeter returns a Meter persisted at path ("" for none), carrying on
// from what the file holds. now is the clock (nil: time.Now).
func NewMeter(path string, now func() time.Time) (*Meter, error) {
	if now == nil {
		now = time.Now
	}
	m := &Meter{path: path, now: now, spent: map[string]*Spent{}, capped: map[string]bool{}}
	if path == "" {
		return m, nil
	}
	f, err := Load(path)
	if err != nil {
		return nil, err
	}
	for k, v := range f {
		m.spent[k] = &v
	}
	return m, nil
}

// Load reads a meter's file: the totals by credential name, none when
// it does not exist.
func Load(path string) (map[string]Spent, error) {
	var err error
	for range 3 { // a read racing the supervisor's write may be torn: read again
		var b []byte
		b, err = os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("usage: %w", err)
		}
		var f struct {
			Credentials map[string]Spent `json:"credentials"`
		}
		if err = json.Unmarshal(b, &f); err == nil {
			return f.Credentials, nil
		}
		time.Sleep(time.Millisecond)
	}
	return nil, fmt.Errorf("usage: %s: %w", path, err)
}

// Exhausted says which of a budget's caps is spent.
type Exhausted struct {
	Credential string
	Budget     policy.Budget
	What       string // "tokens" or "requests"
	Used       int64
	Limit      int64
}

func (e *Exhausted) Error() string {
	period := "in this sandbox"
	if e.Budget.Per == policy.BudgetPerDay {
		period = "today (UTC) in this sandbox"
	}
	return fmt.Sprintf("credential %s has used %s of its budget of %s %s %s", e.Credential,
		itoa(e.Used), itoa(e.Limit), e.What, period)
}

// Admit decides a request through credential cred under budget b (nil:
// no cap). Past either cap it returns *Exhausted and counts nothing;
// otherwise, when model says the request bills tokens, it counts the
// request now, so two requests racing for the last one cannot both pass.
// Tokens are known only when the answer is read (Add): a token cap can be
// overrun by the answers in flight when it is reached, never after.
func (m *Meter) Admit(cred string, b *policy.Budget, model bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(cred)
	if b != nil {
		m.capped[cred] = true
		req, tok := s.Requests, s.Total()
		if b.Per == policy.BudgetPerDay {
			req, tok = s.DayRequests, s.DayTokens
		}
		switch {
		case b.Requests > 0 && req >= b.Requests:
			return &Exhausted{Credential: cred, Budget: *b, What: "requests", Used: req, Limit: b.Requests}
		case b.Tokens > 0 && tok >= b.Tokens:
			return &Exhausted{Credential: cred, Budget: *b, What: "tokens", Used: tok, Limit: b.Tokens}
		}
	}
	if model {
		s.Requests++
		s.DayRequests++
		m.changed(cred)
	}
	return nil
}

// Add counts the tokens an answer reported; counted says the request
// was already counted by Admit (else it is counted now: an endpoint not
// known to bill tokens whose answer did).
func (m *Meter) Add(cred string, t Tokens, counted bool) Spent {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.get(cred)
	if !counted {
		s.Requests++
		s.DayRequests++
	}
	s.Tokens.add(t)
	s.DayTokens += t.Total()
	m.changed(cred)
	return *s
}

// Spent returns a copy of the totals, by credential.
func (m *Meter) Spent() map[string]Spent {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]Spent, len(m.spent))
	for k, v := range m.spent {
		m.rollDay(v)
		out[k] = *v
	}
	return out
}

func (m *Meter) get(cred string) *Spent {
	s := m.spent[cred]
	if s == nil {
		s = &Spent{}
		m.spent[cred] = s
	}
	m.rollDay(s)
	return s
}

// rollDay starts a new day's count when the UTC date has changed.
func (m *Meter) rollDay(s *Spent) {
	if d := m.now().UTC().Format(time.DateOnly); s.Day != d {
		s.Day, s.DayRequests, s.DayTokens = d, 0, 0
	}
}

// changed writes the totals now when cred has a budget, else schedules
// a write within flushDelay. m.mu is held.
func (m *Meter) changed(cred string) {
	if m.path == "" {
		return
	}
	m.dirty = true
	if m.capped[cred] {
		m.save()
		return
	}
	if m.pending == nil {
		m.pending = time.AfterFunc(flushDelay, func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			m.pending = nil
			if m.dirty {
				m.save()
			}
		})
	}
}

// save writes the totals to the meter's file, in place: one write of a
// few hundred bytes at offset 0, padded with spaces to the previous
// length, on a descriptor kept open (a temporary file and a rename per
// model request cost a fifth of a small request's throughput). A write
// that returned is whole for every later reader even if this process
// dies; a reader racing a write may see a torn file, which Load reads
// again. A failure is not fatal: the totals live on in memory and the
// audit log's cred.usage records hold every count.
func (m *Meter) save() {
	if m.path == "" {
		return
	}
	b, err := json.Marshal(struct {
		Credentials map[string]*Spent `json:"credentials"`
	}{m.spent})
	if err != nil {
		return
	}
	if m.f == nil {
		f, err := os.OpenFile(m.path, os.O_WRONLY|os.O_CREATE, 0o600)
		if err != nil {
			return
		}
		m.f = f
		if fi, err := f.Stat(); err == nil {
			m.size = int(fi.Size())
		}
	}
	n := len(b)
	if pad := m.size - n; pad > 0 {
		b = append(b, bytes.Repeat([]byte(" "), pad)...)
	}
	if _, err := m.f.WriteAt(b, 0); err == nil {
		m.size = max(m.size, n)
		m.dirty = false
	}
}

// Close closes the meter's file; the totals stay readable in memory.
func (m *Meter) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending != nil {
		m.pending.Stop()
		m.pending = nil
	}
	if m.dirty {
		m.save()
	}
	if m.f == nil {
		return nil
	}
	err := m.f.Close()
	m.f = nil
	return err
}

// Names returns the credential names in totals, sorted.
func Names(totals map[string]Spent) []string {
	out := make([]string, 0, len(totals))
	for k := range totals {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// File is where a sandbox's meter lives in its directory.
func File(sandboxDir string) string { return filepath.Join(sandboxDir, "usage.json") }

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
