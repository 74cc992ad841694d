package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"smx/internal/errdefs"
	"smx/internal/kernel"
	"smx/internal/snapshot"
)

func newKernelCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kernel",
		Short: "Guest kernels in the cache, and what is pinned to them",
	}
	cmd.AddCommand(kernelLsCmd(e), kernelRmCmd(e))
	return cmd
}

// kernelRow is one cached kernel as `smx kernel ls` shows it.
type kernelRow struct {
	Version   string   `json:"version"`
	Default   bool     `json:"default"` // what new sandboxes get
	Sandboxes []string `json:"sandboxes"`
	Snapshots []string `json:"snapshots"`
}

// kernelUsers maps each kernel version to the sandboxes and snapshots pinned
// to it. A sandbox made before pinning counts for the kernel it last booted.
func (e *env) kernelUsers() (sandboxes, snapshots map[string][]string, err error) {
	sandboxes, snapshots = map[string][]string{}, map[string][]string{}
	list, err := e.manager().List()
	if err != nil {
		return nil, nil, err
	}
	for _, in := range list {
		v := in.Spec.Kernel
		if v == "" {
			v = in.State.Kernel
		}
		if v != "" {
			sandboxes[v] = append(sandboxes[v], in.Spec.Name)
		}
	}
	snaps, err := e.snapshots().List()
	if err != nil {
		return nil, nil, err
	}
	for _, sn := range snaps {
		snapshots[sn.Kernel] = append(snapshots[sn.Kernel], sn.Name)
	}
	return sandboxes, snapshots, nil
}

func kernelLsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List cached guest kernels and the sandboxes and snapshots pinned to each",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ks, err := kernel.List(e.state.Kernels())
			if err != nil {
				return err
			}
			sbs, sns, err := e.kernelUsers()
			if err != nil {
				return err
			}
			rows := []kernelRow{}
			for i, k := range ks {
				rows = append(rows, kernelRow{Version: k.Version, Default: i == 0,
					Sandboxes: nonNil(sbs[k.Version]), Snapshots: nonNil(sns[k.Version])})
			}
			if asJSON {
				return writeJSON(e.stdout, rows)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tDEFAULT\tSANDBOXES\tSNAPSHOTS")
			for _, r := range rows {
				def := ""
				if r.Default {
					def = "*"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Version, def, joinOrDash(r.Sandboxes), joinOrDash(r.Snapshots))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func kernelRmCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "rm VERSION",
		Short: "Remove a cached guest kernel (refused while a sandbox or snapshot is pinned to it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Creates pin the newest kernel under this lock, so none can
			// pin the one being removed.
			lock, err := e.manager().LockAll()
			if err != nil {
				return err
			}
			defer lock.Unlock()
			v := args[0]
			if _, err := kernel.Load(e.state.Kernels(), v); err != nil {
				return err
			}
			sbs, sns, err := e.kernelUsers()
			if err != nil {
				return err
			}
			if len(sbs[v]) > 0 || len(sns[v]) > 0 {
				var users []string
				for _, n := range sbs[v] {
					users = append(users, "sandbox "+n)
				}
				for _, n := range sns[v] {
					users = append(users, "snapshot "+n)
				}
				return fmt.Errorf("kernel: remove %s: still used by %s: remove them first: %w", v, strings.Join(users, ", "), errdefs.ErrInUse)
			}
			if err := e.removeTemplates(func(t *snapshot.Snapshot) bool { return t.Kernel == v }); err != nil {
				return err
			}
			if err := kernel.Remove(e.state.Kernels(), v); err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, v)
			return nil
		},
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func joinOrDash(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return strings.Join(s, ",")
}
