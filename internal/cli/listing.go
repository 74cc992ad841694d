package cli

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

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
}

func (e *env) listEntry(sb service.Sandbox) listEntry {
	le := listEntry{Sandbox: sb}
	if r, err := e.presetRecord(sb.Spec.Name); err == nil {
		le.Preset, le.Workspace, le.AgentExitCode = r.Preset, r.Workspace, r.ExitCode
	}
	return le
}

func writeList(w io.Writer, list []listEntry) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tIMAGE\tPROFILE\tCPUS\tMEMORY\tUPTIME\tREFUSALS\tCREATED\tPRESET\tWORKSPACE")
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
		if wt := le.Spec.Worktree; wt != nil {
			ws = wt.Path + " (" + wt.Branch + ")"
		}
		status := string(le.State.Status)
		if le.AgentExitCode != nil {
			status += fmt.Sprintf(" (exited %d)", *le.AgentExitCode)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%dM\t%s\t%d\t%s\t%s\t%s\n", le.Spec.Name, status, le.Spec.Image, prof,
			le.Spec.CPUs, le.Spec.MemoryMiB, up, le.Refusals, le.Spec.Created.Local().Format(time.DateTime), pr, ws)
	}
	return tw.Flush()
}
