package service

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/preset"
)

// serviceReadyWait bounds how long RunAgent waits for a preset service's
// ready path: dockerd under TCG on a loaded host takes tens of seconds.
const serviceReadyWait = 3 * time.Minute

// servicePath is the PATH preset services start with: daemons such as
// dockerd find their helpers (containerd, runc, iptables) in sbin.
const servicePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// startServices starts an agent's services (its preset's) in sandbox
// name, as root, each in a session of its own (setsid) with its output in
// /var/log/smx-NAME.log, and waits for each one's ready path. A service
// whose ready path is already there runs (a resumed guest) and is left
// alone. A service that does not get ready fails the start with the end
// of its log.
func (s *Service) startServices(ctx context.Context, name, presetName string, services []preset.Service, progress func(AgentProgress)) error {
	for _, sv := range services {
		logFile := "/var/log/smx-" + sv.Name + ".log"
		if sv.Ready != "" && s.guestScript(ctx, name, []string{`[ -e "$1" ]`, "ready", sv.Ready}) == nil {
			continue
		}
		progress(AgentProgress{Stage: "service", Message: "starting " + sv.Name + " in the guest"})
		// The daemon's streams go to its log, so this exec ends at once
		// and nothing of the daemon is tied to it.
		start := `exec setsid -f "$@" >` + logFile + ` 2>&1 </dev/null`
		if err := s.guestScript(ctx, name, append([]string{start, sv.Name}, sv.Command...)); err != nil {
			return fmt.Errorf("preset %s: starting service %s: %w", presetName, sv.Name, err)
		}
		if sv.Ready == "" {
			continue
		}
		tries := strconv.Itoa(int(serviceReadyWait / (250 * time.Millisecond)))
		wait := `i=0; while [ ! -e "$1" ]; do i=$((i+1)); if [ $i -gt ` + tries + ` ]; then tail -n 15 "$2"; exit 1; fi; sleep 0.25; done`
		if err := s.guestScript(ctx, name, []string{wait, "wait", sv.Ready, logFile}); err != nil {
			return fmt.Errorf("preset %s: service %s did not get ready (no %s after %s; `smx agent exec %s -- cat %s` shows its log): %w",
				presetName, sv.Name, sv.Ready, serviceReadyWait, name, logFile, err)
		}
	}
	return nil
}

// restartServices starts the services of the agent in sandbox name again
// after a start that booted the guest afresh (a cold boot, or a boot
// template: /run is empty); a guest resumed from suspend or a snapshot
// kept its processes. A sandbox that runs no agent has none.
func (s *Service) restartServices(ctx context.Context, name, restoredFrom string) error {
	if strings.HasPrefix(restoredFrom, "suspend") || strings.HasPrefix(restoredFrom, "snapshot") {
		return nil
	}
	rec, err := s.AgentRecord(name)
	if err != nil || len(rec.Services) == 0 {
		return nil
	}
	return s.startServices(ctx, name, rec.Preset, rec.Services, func(AgentProgress) {})
}

// guestScript runs /bin/sh -c args[0] args[1:]... as root in the guest;
// a non-zero exit is an error carrying the script's output.
func (s *Service) guestScript(ctx context.Context, name string, args []string) error {
	var out bytes.Buffer
	st, err := s.Exec(ctx, ExecRequest{Name: name, Args: append([]string{"/bin/sh", "-c"}, args...),
		Env: []string{servicePath}, Label: "agent"}, ExecIO{Stdout: &out, Stderr: &out})
	if err != nil {
		return err
	}
	if st.Code != 0 {
		return fmt.Errorf("exit %d: %s: %w", st.Code, strings.TrimSpace(out.String()), errdefs.ErrFailed)
	}
	return nil
}
