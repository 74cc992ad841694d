package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/smx-dev/smx/internal/service"
)

// How the user attached to an agent learns of a question (a rule that says
// ask): the agent's TUI owns the terminal (raw mode, often the alternate
// screen), and any byte smx wrote into that stream, a bell or a title
// escape included, could land inside one of the agent's escape sequences
// and corrupt its screen. So nothing is written there while attached:
//
//   - a desktop notification (notify-send, when the session has a display),
//     naming the sandbox, what is asked and the command that answers;
//   - on detach, the questions still waiting are printed once the terminal
//     is ours again;
//   - `smx approvals --watch` in another terminal (or the console, or an
//     MCP client) is where questions are answered.
//
// The agent itself sees a held request as a slow one, and `smx-why` in
// the guest lists what waits.

// askWatcher polls the sandbox's questions while the terminal is attached.
type askWatcher struct {
	e    *env
	name string
	seen map[string]bool
}

func (w *askWatcher) run(ctx context.Context) {
	notify := notifier()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		list, err := w.e.svc().ListApprovals(ctx, w.name)
		if err != nil {
			continue
		}
		for _, a := range list {
			if w.seen[a.ID] {
				continue
			}
			w.seen[a.ID] = true
			if notify != nil {
				notify(a)
			}
		}
	}
}

// notifier returns a desktop notifier, or nil when the session has no
// display or no notify-send.
func notifier() func(service.Approval) {
	if os.Getenv("DISPLAY") == "" && os.Getenv("WAYLAND_DISPLAY") == "" {
		return nil
	}
	bin, err := exec.LookPath("notify-send")
	if err != nil {
		return nil
	}
	return func(a service.Approval) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c := exec.CommandContext(ctx, bin, "--app-name=smx", "smx: sandbox "+a.Sandbox+" asks",
			fmt.Sprintf("%s\nsmx approve %s   (or --sandbox, --always; smx deny %s)", a.What, a.ID, a.ID))
		c.Run()
	}
}

// printWaiting prints the questions still waiting for sandbox name, after
// a detach.
func (e *env) printWaiting(name string) {
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	list, err := e.svc().ListApprovals(ctx, name)
	if err != nil || len(list) == 0 {
		return
	}
	fmt.Fprintf(e.stderr, "smx: %d request(s) of %s wait for your answer:\n", len(list), name)
	for _, a := range list {
		fmt.Fprintf(e.stderr, "  %s %s %s (refused in %s unless answered): smx approve %s [--sandbox|--always] | smx deny %s\n",
			a.ID, a.Channel, a.What, expiresIn(a), a.ID, a.ID)
	}
}
