package cli

import (
	"fmt"
	"io"
	"path/filepath"
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

func writeList(w io.Writer, list []wire.Sandbox) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tIMAGE\tPROFILE\tCPUS\tMEMORY\tUPTIME\tREFUSALS\tCREATED\tPRESET\tWORKSPACE")
	for _, sb := range list {
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
		status := sb.Status
		if sb.AgentExitCode != nil {
			status += fmt.Sprintf(" (exited %d)", *sb.AgentExitCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%dM\t%s\t%d\t%s\t%s\t%s\n", sb.Name, status, sb.Image, prof,
			sb.CPUs, sb.MemoryMiB, up, sb.Refusals, sb.Created.Local().Format(time.DateTime), pr, ws)
	}
	return tw.Flush()
}
