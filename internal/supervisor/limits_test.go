package supervisor

import (
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
)

// TestLimitsActivity: which requests keep a sandbox from being idle, and
// how often --idle-stop looks.
func TestLimitsActivity(t *testing.T) {
	exec := &agentproto.Request{Op: agentproto.OpExec}
	for label, want := range map[string]bool{"": true, "run": true, "agent": false, "attach": false, "agent-wait": false} {
		if got := active(exec, label); got != want {
			t.Errorf("exec labelled %q active = %v, want %v", label, got, want)
		}
	}
	for op, want := range map[string]bool{agentproto.OpCopyIn: true, agentproto.OpCopyOut: true, agentproto.OpHealth: false} {
		if got := active(&agentproto.Request{Op: op}, ""); got != want {
			t.Errorf("%s active = %v, want %v", op, got, want)
		}
	}
	for limit, want := range map[time.Duration]time.Duration{5 * time.Second: time.Second, time.Minute: 6 * time.Second, 4 * time.Hour: 30 * time.Second} {
		if got := idleCheck(limit); got != want {
			t.Errorf("idleCheck(%v) = %v, want %v", limit, got, want)
		}
	}
}
