package guest

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
)

type funcStep func(b *Boot) error

func (funcStep) String() string      { return "test step" }
func (f funcStep) Run(b *Boot) error { return f(b) }

// A Beside step runs while the boot goes on, and the server holds an
// exec back until it has ended, while it answers requests that do not
// touch the user's files or processes (health) at once.
func TestBesideStepGatesExec(t *testing.T) {
	release := make(chan struct{})
	var grown atomic.Bool
	b := &Boot{Log: slog.New(slog.DiscardHandler)}
	after := false
	err := b.Run([]Step{
		Beside{funcStep(func(*Boot) error { <-release; grown.Store(true); return nil })},
		funcStep(func(*Boot) error { after = true; return nil }),
	})
	if err != nil || !after {
		t.Fatalf("Run = %v, later step ran: %v", err, after)
	}
	sess := startServer(t, func(s *Server) { s.Settled = b.Settled })
	st := openRequest(t, sess, agentproto.Request{Op: agentproto.OpHealth})
	if _, err := result(t, st); err != nil {
		t.Fatalf("health while a step runs beside: %v", err)
	}
	st.Close()
	done := make(chan *execResult, 1)
	go func() { done <- run(t, sess, agentproto.ExecRequest{Args: []string{"true"}}, nil) }()
	select {
	case <-done:
		t.Fatal("exec ran before the background step ended")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	r := <-done
	mustExit(t, r, 0)
	if !grown.Load() {
		t.Fatal("exec ended, the background step had not")
	}
}
