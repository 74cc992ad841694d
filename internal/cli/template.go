package cli

import (
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/errdefs"
)

// Boot templates are made and used by supervisors (see
// internal/supervisor/template.go); the CLI lists them and removes them,
// also when their image or kernel goes.

func newTemplateCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Boot templates: saved post-boot guests that first starts restore instead of booting",
	}
	cmd.AddCommand(templateLsCmd(e), templateRmCmd(e), templatePushCmd(e), templatePullCmd(e))
	return cmd
}

func templateLsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List boot templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := e.svc().ListTemplates(e.ctx)
			if err != nil {
				return err
			}
			if asJSON {
				out := []wire.Snapshot{}
				for i := range list {
					out = append(out, *api.WireSnapshot(&list[i]))
				}
				return writeJSON(e.stdout, out)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tIMAGE\tKERNEL\tCPUS\tMEMORY\tDISK\tSTATE\tSHARED RAM\tCREATED")
			for _, t := range list {
				// The shared-RAM form is made after the template is saved,
				// in the background; until then restores load the state.
				shared := "-"
				if t.SharedRAMBytes > 0 {
					shared = humanBytes(t.SharedRAMBytes)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dM\t%s\t%s\t%s\t%s\n", t.Name, t.Image, t.Kernel, t.CPUs,
					t.MemoryMiB, humanBytes(t.DiskBytes), humanBytes(t.MemoryStateBytes), shared,
					t.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func templateRmCmd(e *env) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "rm NAME... | --all",
		Short: "Remove boot templates (refused while a sandbox or snapshot is backed by one); the next start boots cold",
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return fmt.Errorf("template rm: name templates or pass --all (not both): %w", errdefs.ErrInvalid)
			}
			if all {
				_, err := e.svc().RemoveTemplates(e.ctx, nil)
				return err
			}
			for _, n := range args {
				if err := e.svc().RemoveTemplate(e.ctx, n); err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, n)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "remove every template not in use")
	return cmd
}
