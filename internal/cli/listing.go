package cli

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/service"
)

// wire is the API's view of the service: what `smx serve` answers, so
// that --json prints the API's wire types (package api), one shape of
// each object for the CLI, the API and its clients.
func (e *env) wire() api.ServiceBackend { return api.ServiceBackend{S: e.svc()} }

// wireSandbox is sb as `ls --json` and the --json answer of create, start
// and restore print it: the API's Sandbox (without its QEMU command line;
// with its uptime, refusals and the agent `smx agent run` started).
func (e *env) wireSandbox(sb *service.Sandbox) *wire.Sandbox { return e.wire().WireSandbox(sb) }

// portsColumn is docker ps's PORTS for sb: HOSTIP:HOSTPORT->GUESTPORT/tcp,
// a port published as 0 with the port its running supervisor bound (or
// "0" until a start).
func (e *env) portsColumn(sb service.Sandbox) string {
	var out []string
	if slices.ContainsFunc(sb.Spec.Ports, func(p service.Port) bool { return p.HostPort == 0 }) {
		if l, err := e.svc().Ports(e.ctx, sb.Spec.Name); err == nil && l.Running {
			for _, b := range l.Ports {
				out = append(out, fmt.Sprintf("%s->%d/tcp", b.Host(b.Bound), b.GuestPort))
			}
			return strings.Join(out, ",")
		}
	}
	for _, p := range sb.Spec.Ports {
		out = append(out, fmt.Sprintf("%s->%d/tcp", p.Host(p.HostPort), p.GuestPort))
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}

// writeList prints the sandboxes as a table; ports[i] is list[i]'s PORTS.
func writeList(w io.Writer, list []wire.Sandbox, ports []string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tIMAGE\tPROFILE\tCPUS\tMEMORY\tUPTIME\tREFUSALS\tCREATED\tPRESET\tWORKSPACE\tPORTS")
	for i, sb := range list {
		up := "-"
		if sb.UptimeSeconds > 0 {
			up = (time.Duration(sb.UptimeSeconds) * time.Second).String()
		}
		pr, ws, prof := "-", "-", sb.Profile
		if sb.Preset != "" {
			pr, ws = sb.Preset, sb.Workspace
			// The profile `smx agent run` wrote for the preset (STATE/presets/).
			if filepath.Base(filepath.Dir(prof)) == "presets" {
				prof = strings.TrimSuffix(filepath.Base(prof), ".yaml") + " (preset)"
			}
		}
		if wt := sb.Worktree; wt != nil {
			ws = wt.Path + " (" + wt.Branch + ")"
		}
		status := sb.Status
		if sb.AgentExitCode != nil {
			status += fmt.Sprintf(" (exited %d)", *sb.AgentExitCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%dM\t%s\t%d\t%s\t%s\t%s\t%s\n", sb.Name, status, sb.Image, prof,
			sb.CPUs, sb.MemoryMiB, up, sb.Refusals, sb.Created.Local().Format(time.DateTime), pr, ws, ports[i])
	}
	return tw.Flush()
}
