package cli

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/smx-dev/smx/internal/publish"
	"github.com/smx-dev/smx/internal/service"
)

// listEntry is one sandbox in `ls --json` and in the --json answer of
// create, start and restore: the service's summary of it (the sandbox
// without its QEMU command line, with its uptime and refusals).
type listEntry struct {
	service.Sandbox
	Preset    string `json:"preset,omitempty"`    // set by `smx agent run`
	Workspace string `json:"workspace,omitempty"` // the host folder at /work
	// AgentExitCode is the agent's exit status once it has ended.
	AgentExitCode *int `json:"agent_exit_code,omitempty"`
	// bound are the ports a running supervisor serves, asked only for a
	// sandbox with a port published as 0 (the spec knows the others).
	bound []publish.Binding
}

func (e *env) listEntry(sb service.Sandbox) listEntry {
	le := listEntry{Sandbox: sb}
	if r, err := e.presetRecord(sb.Spec.Name); err == nil {
		le.Preset, le.Workspace, le.AgentExitCode = r.Preset, r.Workspace, r.ExitCode
	}
	if slices.ContainsFunc(sb.Spec.Ports, func(p publish.Port) bool { return p.HostPort == 0 }) {
		if l, err := e.svc().Ports(e.ctx, sb.Spec.Name); err == nil && l.Running {
			le.bound = l.Ports
		}
	}
	return le
}

// portsColumn is docker ps's PORTS: HOSTIP:HOSTPORT->GUESTPORT/tcp, a
// port published as 0 with the port bound now (or "0" until a start).
func (le listEntry) portsColumn() string {
	var out []string
	if le.bound != nil {
		for _, b := range le.bound {
			out = append(out, fmt.Sprintf("%s->%d/tcp", b.Host(b.Bound), b.GuestPort))
		}
	} else {
		for _, p := range le.Spec.Ports {
			out = append(out, fmt.Sprintf("%s->%d/tcp", p.Host(p.HostPort), p.GuestPort))
		}
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}

func writeList(w io.Writer, list []listEntry) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tIMAGE\tPROFILE\tCPUS\tMEMORY\tUPTIME\tREFUSALS\tCREATED\tPRESET\tWORKSPACE\tPORTS")
	for _, le := range list {
		up := "-"
		if le.UptimeSeconds > 0 {
			up = (time.Duration(le.UptimeSeconds) * time.Second).String()
		}
		pr, ws, prof := "-", "-", le.Spec.Profile
		if le.Preset != "" {
			pr, ws = le.Preset, le.Workspace
			// The profile `smx agent run` wrote for the preset (STATE/presets/).
			if filepath.Base(filepath.Dir(prof)) == "presets" {
				prof = strings.TrimSuffix(filepath.Base(prof), ".yaml") + " (preset)"
			}
		}
		status := string(le.State.Status)
		if le.AgentExitCode != nil {
			status += fmt.Sprintf(" (exited %d)", *le.AgentExitCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%dM\t%s\t%d\t%s\t%s\t%s\t%s\n", le.Spec.Name, status, le.Spec.Image, prof,
			le.Spec.CPUs, le.Spec.MemoryMiB, up, le.Refusals, le.Spec.Created.Local().Format(time.DateTime), pr, ws, le.portsColumn())
	}
	return tw.Flush()
}
