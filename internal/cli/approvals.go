package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

func newApprovalsCmd(e *env) *cobra.Command {
	var asJSON, watch bool
	var name string
	cmd := &cobra.Command{
		Use:   "approvals [--sandbox NAME] [--watch] [--json]",
		Short: "List the requests that wait for your answer (rules that say ask)",
		Long: "List the requests the sandboxes' gateways hold because a profile rule says ask,\n" +
			"oldest first. Answer one with `smx approve ID [--sandbox|--always]` or `smx deny ID`;\n" +
			"unanswered, it is refused when it expires (ask.timeout, 60s by default).\n" +
			"--watch prints each new question as it is asked, until interrupted.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			svc := e.svc()
			if !watch {
				list, err := svc.ListApprovals(e.ctx, name)
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(e.stdout, map[string]any{"approvals": list})
				}
				if len(list) == 0 {
					fmt.Fprintln(e.stdout, "Nothing waits for an answer.")
					return nil
				}
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tSANDBOX\tCHANNEL\tWHAT\tEXPIRES IN\tRULE")
				for _, a := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", a.ID, a.Sandbox, a.Channel, a.What, expiresIn(a), a.Rule)
				}
				return tw.Flush()
			}
			ctx, stop := signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			seen := map[string]bool{}
			enc := json.NewEncoder(e.stdout)
			t := time.NewTicker(300 * time.Millisecond)
			defer t.Stop()
			for {
				list, err := svc.ListApprovals(ctx, name)
				if err != nil && ctx.Err() == nil {
					return err
				}
				for _, a := range list {
					if seen[a.ID] {
						continue
					}
					seen[a.ID] = true
					if asJSON {
						if err := enc.Encode(a); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintf(e.stdout, "%s %s %s: %s (rule %s; expires in %s)\n", a.ID, a.Sandbox, a.Channel, a.What, a.Rule, expiresIn(a))
				}
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
			}
		},
	}
	cmd.Flags().StringVar(&name, "sandbox", "", "only this sandbox")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON ({\"approvals\": [...]}; with --watch one approval per line)")
	cmd.Flags().BoolVar(&watch, "watch", false, "print new questions as they are asked")
	return cmd
}

func expiresIn(a service.Approval) string {
	d := time.Until(a.Expires).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String()
}

func newApproveCmd(e *env) *cobra.Command {
	var asJSON, forSandbox, always bool
	cmd := &cobra.Command{
		Use:   "approve ID [--sandbox|--always]",
		Short: "Allow a request that waits for your answer",
		Long: "Allow the held request ID (from `smx approvals`): by default this once (the next\n" +
			"identical request asks again); --sandbox for the rest of the sandbox's life;\n" +
			"--always writes the rule into the sandbox's profile file (in a marked section,\n" +
			"with a comment naming the approval) and reloads it.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if forSandbox && always {
				return fmt.Errorf("--sandbox and --always: give one: %w", errdefs.ErrInvalid)
			}
			d := service.DecideOnce
			switch {
			case forSandbox:
				d = service.DecideSandbox
			case always:
				d = service.DecideAlways
			}
			return answer(e, args[0], d, asJSON)
		},
	}
	cmd.Flags().BoolVar(&forSandbox, "sandbox", false, "allow it for the rest of the sandbox's life")
	cmd.Flags().BoolVar(&always, "always", false, "allow it from now on: write the rule into the profile file")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the approval as JSON")
	return cmd
}

func newDenyCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "deny ID",
		Short: "Refuse a request that waits for your answer",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return answer(e, args[0], service.DecideDeny, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the approval as JSON")
	return cmd
}

func answer(e *env, id, decision string, asJSON bool) error {
	a, err := e.svc().AnswerApproval(e.ctx, service.AnswerRequest{ID: id, Decision: decision, By: "cli"})
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(e.stdout, a)
	}
	switch decision {
	case service.DecideDeny:
		fmt.Fprintf(e.stdout, "denied %s: %s\n", a.ID, a.What)
	case service.DecideAlways:
		fmt.Fprintf(e.stdout, "allowed %s: %s\nwrote %s to %s\n", a.ID, a.What, a.RuleWritten, a.ProfileFile)
	default:
		fmt.Fprintf(e.stdout, "allowed %s (%s): %s\n", a.ID, decision, a.What)
	}
	return nil
}
