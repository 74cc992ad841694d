package fsgw

import (
	"sync"
	"time"
)

// Refusals are logged one by one until the same (op, path) has been
// refused limitBurst times in a window; the rest of that window is counted
// and logged as one summary record when the window ends. limitKeys bounds
// the memory a guest that refuses itself across many paths can take: past
// it, refusals of new keys go to a catch-all summary.
const (
	limitWindow = 10 * time.Second
	limitBurst  = 3
	limitKeys   = 4096
)

type limitKey struct{ op, path string }

type limitEntry struct {
	n          int // refusals in this window
	rule, why  string
	suppressed int
}

type limiter struct {
	emit func(map[string]any)

	mu       sync.Mutex
	keys     map[limitKey]*limitEntry
	overflow int // refusals of keys beyond limitKeys, this window
}

func newLimiter(emit func(map[string]any)) *limiter {
	if emit == nil {
		emit = func(map[string]any) {}
	}
	return &limiter{emit: emit, keys: map[limitKey]*limitEntry{}}
}

func (l *limiter) refuse(op, p, rule, reason string) {
	k := limitKey{op, p}
	l.mu.Lock()
	e := l.keys[k]
	if e == nil {
		if len(l.keys) >= limitKeys {
			l.overflow++
			l.mu.Unlock()
			return
		}
		e = &limitEntry{}
		l.keys[k] = e
	}
	e.n++
	e.rule, e.why = rule, reason
	if e.n > limitBurst {
		e.suppressed++
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.emit(map[string]any{"op": op, "path": p, "rule": rule, "reason": reason})
}

// flush writes the summaries of the window that ended and starts a new
// one. With all set it also ends the window early (Close).
func (l *limiter) flush(all bool) {
	l.mu.Lock()
	keys, over := l.keys, l.overflow
	l.keys, l.overflow = map[limitKey]*limitEntry{}, 0
	l.mu.Unlock()
	for k, e := range keys {
		if e.suppressed > 0 {
			l.emit(map[string]any{"op": k.op, "path": k.path, "rule": e.rule, "reason": e.why,
				"repeated": e.suppressed, "window_s": int(limitWindow / time.Second)})
		}
	}
	if over > 0 {
		l.emit(map[string]any{"op": "*", "path": "*", "rule": "builtin: file gateway",
			"reason": "refusals across too many paths to list one by one", "repeated": over,
			"window_s": int(limitWindow / time.Second)})
	}
	_ = all
}
