package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/service"
)

func agentMountCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mount",
		Short: "Add host folders to a running sandbox, or remove them",
		Long: "A mount added while the sandbox runs rides its virtio-fs device (QEMU 8.2 or newer, a\n" +
			"sandbox started with at least one -v mount): the same file gateway as a -v mount at\n" +
			"create decides every operation on it with the sandbox's profile. It is kept for later\n" +
			"starts and recorded as mount.add. A removed mount leaves the guest at once (even when a\n" +
			"process is using it) and the host stops serving it: files the guest still holds open\n" +
			"there fail from their next read or write. Recorded as mount.remove.",
	}
	cmd.AddCommand(agentMountAddCmd(e), agentMountRmCmd(e))
	return cmd
}

func printMounts(e *env, l *service.MountList, asJSON bool) error {
	if asJSON {
		wl, err := api.WireMounts(l, nil)
		if err != nil {
			return err
		}
		return writeJSON(e.stdout, wl)
	}
	for _, m := range l.Mounts {
		fmt.Fprintln(e.stdout, m)
	}
	return nil
}

func agentMountAddCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "add NAME HOSTPATH:GUESTPATH[:ro]...",
		Short: "Mount host folders in a running sandbox (-v notation; prints the mounts afterwards)",
		Example: "  smx agent mount add web ./data:/data\n" +
			"  smx agent mount add web ~/docs:/docs:ro",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var l *service.MountList
			for _, m := range args[1:] {
				var err error
				if l, err = e.svc().AddMount(e.ctx, service.MountRequest{Name: args[0], Mount: m}); err != nil {
					return err
				}
			}
			return printMounts(e, l, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func agentMountRmCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "rm NAME GUESTPATH...",
		Short:   "Unmount folders from a running sandbox; files open in them fail from then on",
		Example: "  smx agent mount rm web /data",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var l *service.MountList
			for _, g := range args[1:] {
				var err error
				if l, err = e.svc().RemoveMount(e.ctx, service.MountRequest{Name: args[0], Guest: g}); err != nil {
					return err
				}
			}
			if asJSON {
				return printMounts(e, l, true)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the mounts afterwards as JSON")
	return cmd
}
