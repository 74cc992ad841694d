package netstack

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/approval"
)

// hostAsks is a real approval.Holder (the one the supervisor keeps) for the
// ask tests, answered by the test as the host user would be through the
// service; it keeps the kinds of approval record it writes, in order.
type hostAsks struct {
	holder  *approval.Holder
	timeout atomic.Int64 // ask.timeout, nanoseconds

	recMu sync.Mutex
	recs  []string
}

func newHostAsks() *hostAsks {
	h := &hostAsks{}
	h.timeout.Store(int64(time.Minute))
	h.holder = approval.New("sb", func(kind string, _ map[string]any) {
		h.recMu.Lock()
		h.recs = append(h.recs, kind)
		h.recMu.Unlock()
	}, func() (time.Duration, int) { return time.Duration(h.timeout.Load()), 4 })
	return h
}

// question waits for exactly one pending question.
func (h *hostAsks) question(t *testing.T) approval.Approval {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if l := h.holder.List(); len(l) == 1 {
			return l[0]
		} else if len(l) > 1 {
			t.Fatalf("%d questions pending, want 1: %+v", len(l), l)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no question was asked")
	return approval.Approval{}
}

// count is how many approval records of kind were written.
func (h *hostAsks) count(kind string) int {
	h.recMu.Lock()
	defer h.recMu.Unlock()
	n := 0
	for _, k := range h.recs {
		if k == kind {
			n++
		}
	}
	return n
}
