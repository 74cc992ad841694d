// The audit of one exec: its start, end, exit and output size, recorded
// in the sandbox's log.

package supervisor

import (
	"encoding/json"
	"io"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/audit"
)

// execAudit follows one exec for the log.
type execAudit struct {
	s     *Supervisor
	kind  string // run or exec
	start time.Time
	pid   int
	out   int64 // bytes of stdout and stderr
}

func (s *Supervisor) execStart(req *agentproto.ExecRequest, label string) *execAudit {
	kind := audit.KindExecStart
	ex := &execAudit{s: s, kind: "exec", start: time.Now()}
	if label == "run" || label == "agent-wait" {
		kind, ex.kind = audit.KindRunStart, "run"
	}
	user := req.User
	if user == "" {
		user = "root"
	}
	// Environment names only: values may be secrets.
	var envNames []string
	for _, kv := range req.Env {
		k, _, _ := strings.Cut(kv, "=")
		envNames = append(envNames, k)
	}
	s.audit(kind, map[string]any{"args": s.execRedactor().Strings(req.Args), "user": user, "dir": req.Dir, "tty": req.TTY, "env": envNames})
	return ex
}

func (ex *execAudit) end(exit *agentproto.ExitStatus, err error) {
	if ex == nil {
		return
	}
	kind := audit.KindExecEnd
	if ex.kind == "run" {
		kind = audit.KindRunEnd
	}
	f := map[string]any{"duration_ms": time.Since(ex.start).Milliseconds(), "pid": ex.pid, "output_bytes": ex.out}
	switch {
	case exit != nil:
		f["exit_code"] = exit.Code
		if exit.Signal != 0 {
			f["signal"] = exit.Signal
		}
	case err != nil:
		f["error"] = err.Error()
	default:
		f["error"] = "client went away before the process exited (killed)"
	}
	ex.s.audit(kind, f)
}

// relayExec copies the guest's exec frames to the client, noting the PID,
// output size and exit status for the log. The exit frame itself is not
// copied but returned (raw), for the caller to send once it has logged it.
func relayExec(dst io.Writer, src io.Reader, ex *execAudit) (*agentproto.ExitStatus, []byte, error) {
	buf := make([]byte, agentproto.DataChunk+5)
	for {
		t, p, err := agentproto.ReadFrame(src, buf)
		if err != nil {
			if err == io.EOF {
				return nil, nil, nil
			}
			return nil, nil, err
		}
		if t == agentproto.FrameExit {
			var es agentproto.ExitStatus
			if err := json.Unmarshal(p, &es); err != nil {
				return nil, nil, err
			}
			return &es, append([]byte(nil), p...), nil
		}
		if err := agentproto.WriteFrame(dst, t, p); err != nil {
			return nil, nil, nil // the client went away
		}
		switch t {
		case agentproto.FrameStarted:
			var st agentproto.Started
			if json.Unmarshal(p, &st) == nil {
				ex.pid = st.PID
			}
		case agentproto.FrameStdout, agentproto.FrameStderr:
			ex.out += int64(len(p))
			ex.s.act.touch()
		case agentproto.FrameError:
			return nil, nil, agentproto.DecodeError(p)
		}
	}
}
