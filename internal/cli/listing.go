package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"smx/internal/audit"
	"smx/internal/sandbox"
)

// listEntry is one sandbox in `ls --json` and in the --json answer of
// create, start and restore: the sandbox without its QEMU command line
// (that is what inspect is for), with what ls shows besides.
type listEntry struct {
	sandbox.Info
	UptimeSeconds int64 `json:"uptime_seconds,omitempty"`
	Refusals      int64 `json:"refusals"`
}

func (e *env) listEntry(in sandbox.Info) listEntry {
	in.State.QEMUArgs = nil
	le := listEntry{Info: in, Refusals: e.refusals(in.Spec.Name)}
	if up := uptime(in); up > 0 {
		le.UptimeSeconds = int64(up / time.Second)
	}
	return le
}

// uptime is how long a live sandbox has been up, 0 for one that is not.
func uptime(in sandbox.Info) time.Duration {
	switch in.State.Status {
	case sandbox.StatusRunning, sandbox.StatusPaused, sandbox.StatusBlocked:
		if !in.State.Started.IsZero() {
			return time.Since(in.State.Started)
		}
	}
	return 0
}

// refusals counts the policy refusals in a sandbox's log (0 without one).
func (e *env) refusals(name string) int64 {
	n, _ := audit.CountRefusals(audit.Dir(e.state.Logs(), name))
	return n
}

func writeList(w io.Writer, list []listEntry) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tIMAGE\tPROFILE\tCPUS\tMEMORY\tUPTIME\tREFUSALS\tCREATED")
	for _, le := range list {
		up := "-"
		if le.UptimeSeconds > 0 {
			up = (time.Duration(le.UptimeSeconds) * time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%dM\t%s\t%d\t%s\n", le.Spec.Name, le.State.Status, le.Spec.Image, le.Spec.Profile,
			le.Spec.CPUs, le.Spec.MemoryMiB, up, le.Refusals, le.Spec.Created.Local().Format(time.DateTime))
	}
	return tw.Flush()
}
