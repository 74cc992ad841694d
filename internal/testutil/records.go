package testutil

import (
	"encoding/json"
	"os"
	"sync"
)

// Records collects what a gateway logs through its Log func(kind, fields):
// each record keeps its kind under "kind". It is safe for concurrent use;
// the zero value is ready.
type Records struct {
	mu  sync.Mutex
	all []map[string]any
}

// Log is the gateway's Log.
func (r *Records) Log(kind string, f map[string]any) {
	f["kind"] = kind
	r.mu.Lock()
	r.all = append(r.all, f)
	r.mu.Unlock()
}

// Kind returns the records of one kind, oldest first.
func (r *Records) Kind(kind string) []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]any
	for _, f := range r.all {
		if f["kind"] == kind {
			out = append(out, f)
		}
	}
	return out
}

// JSON is every record so far as one JSON array, for failure messages.
func (r *Records) JSON() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, _ := json.Marshal(r.all)
	return string(b)
}

// Secret is a gateway's Secret func that knows the one secret name, and
// for any other name reports os.ErrNotExist, as the host's store does.
func Secret(name string, value []byte) func(string) ([]byte, error) {
	return func(n string) ([]byte, error) {
		if n == name {
			return value, nil
		}
		return nil, os.ErrNotExist
	}
}
