package api

import (
	"encoding/json"
	"net/http"
	"sync"

	wire "github.com/smx-dev/smx/api"
)

// runAgent answers POST /v1/agents. Launching an agent can take minutes
// (the preset's image is built on first use), so the answer streams as
// JSON lines of AgentEvent: progress, then one "agent" or "error" line.
// An error found before the first progress event (bad request, unknown
// preset) is an ordinary error answer with its status instead.
func (s *Server) runAgent(w http.ResponseWriter, r *http.Request) error {
	var req wire.AgentRequest
	if err := readJSON(w, r, &req); err != nil {
		return err
	}
	var mu sync.Mutex
	started := false
	rc := http.NewResponseController(w)
	emit := func(ev wire.AgentEvent) {
		mu.Lock()
		defer mu.Unlock()
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		json.NewEncoder(w).Encode(ev)
		rc.Flush()
	}
	ag, err := s.Backend.RunAgent(r.Context(), req, emit)
	if err != nil {
		mu.Lock()
		early := !started
		mu.Unlock()
		if early {
			return err
		}
		body := s.errorBody(err)
		s.Log.Debug("api error", "method", r.Method, "path", r.URL.Path, "class", body.Class, "err", err)
		emit(wire.AgentEvent{Type: "error", Error: &body})
		return nil
	}
	emit(wire.AgentEvent{Type: "agent", Agent: ag})
	return nil
}
