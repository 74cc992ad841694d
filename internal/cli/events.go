package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/api"
)

func newEventsCmd(e *env) *cobra.Command {
	var asJSON, all bool
	var names []string
	cmd := &cobra.Command{
		Use:   "events [--sandbox NAME]... [--json] [--all]",
		Short: "Stream sandbox lifecycle changes and refusals as they happen",
		Long: "Print each sandbox's status changes (created, running, paused, stopped, crashed,\n" +
			"removed, ...) and its log's lifecycle records and policy refusals as they happen,\n" +
			"until interrupted. Every selected sandbox's current status comes first.\n" +
			"--json prints one JSON object per line (as GET /v1/events does).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			enc := json.NewEncoder(e.stdout)
			return api.WatchEvents(ctx, e.state, api.EventQuery{Sandboxes: names, All: all}, func(ev wire.Event) error {
				if asJSON {
					return enc.Encode(ev)
				}
				_, err := fmt.Fprintln(e.stdout, formatEvent(ev))
				return err
			})
		},
	}
	cmd.Flags().StringArrayVar(&names, "sandbox", nil, "only this sandbox (repeatable)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, one event per line")
	cmd.Flags().BoolVar(&all, "all", false, "every log record, not only lifecycle changes and refusals")
	return cmd
}

func formatEvent(ev wire.Event) string {
	t := ev.Time.Local().Format("15:04:05.000")
	if ev.Record == nil {
		return fmt.Sprintf("%s %-20s status %s", t, ev.Sandbox, ev.Status)
	}
	keys := make([]string, 0, len(ev.Record.Fields))
	for k := range ev.Record.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		v, _ := json.Marshal(ev.Record.Fields[k])
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	return fmt.Sprintf("%s %-20s %s%s", t, ev.Sandbox, ev.Record.Kind, b.String())
}
