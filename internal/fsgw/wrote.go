package fsgw

import "sync"

// Writes the profile allowed are noted once per guest path and gateway,
// so that the log says what a run changed (`smx profile learn` reads it)
// without a record per write(2). wroteKeys bounds the memory a guest that
// writes many files can take: past it, one record says that later paths
// were not noted.
const wroteKeys = 4096

type wroteSet struct {
	emit func(map[string]any)

	mu       sync.Mutex
	seen     map[string]struct{}
	overflow bool
}

func newWroteSet(emit func(map[string]any)) *wroteSet {
	return &wroteSet{emit: emit, seen: map[string]struct{}{}}
}

// note records the first allowed write-class operation on guest path p.
func (w *wroteSet) note(op, p, rule string) {
	if w == nil || w.emit == nil {
		return
	}
	w.mu.Lock()
	if _, ok := w.seen[p]; ok {
		w.mu.Unlock()
		return
	}
	if len(w.seen) >= wroteKeys {
		first := !w.overflow
		w.overflow = true
		w.mu.Unlock()
		if first {
			w.emit(map[string]any{"op": "*", "path": "*", "overflow": true,
				"reason": "more than 4096 paths written in this mount since the sandbox started; later ones are not noted one by one"})
		}
		return
	}
	w.seen[p] = struct{}{}
	w.mu.Unlock()
	w.emit(map[string]any{"op": op, "path": p, "rule": rule})
}
