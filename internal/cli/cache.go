package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/service"
)

// smx cache: the named package caches of --volume-cache and files.caches
// (as docker volume ls|rm|prune).
func newCacheCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "cache", Short: "List and remove the package caches sandboxes share (--volume-cache)"}
	cmd.AddCommand(cacheLsCmd(e), cacheRmCmd(e), cachePruneCmd(e))
	return cmd
}

func cacheLsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List caches: mode, size, and the sandboxes using each",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := e.svc().Caches(e.ctx)
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []service.CacheInfo{}
				}
				return writeJSON(e.stdout, list)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tMODE\tSIZE\tFILES\tUSED BY\tCREATED\tPATH")
			for _, c := range list {
				used := strings.Join(c.UsedBy, ",")
				if used == "" {
					used = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\n", c.Name, c.Mode, humanBytes(c.Bytes), c.Files, used,
					c.Created.Local().Format(time.DateTime), c.Path)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func cacheRmCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove caches and their content (refused while a sandbox uses one)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, n := range args {
				if err := e.svc().RemoveCaches(e.ctx, service.CacheRemoveRequest{Names: []string{n}}); err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, n)
			}
			return nil
		},
	}
}

func cachePruneCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "prune",
		Short: "Remove every cache no sandbox uses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			gone, err := e.svc().PruneCaches(e.ctx)
			for _, n := range gone {
				fmt.Fprintln(e.stdout, n)
			}
			return err
		},
	}
}
