package cli

import (
	"fmt"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/service"
)

func agentPauseCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "pause NAME",
		Short: "Stop a sandbox's vCPUs; its memory stays in place (`smx agent resume` continues)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := e.svc().Pause(e.ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s paused\n", args[0])
			return nil
		},
	}
}

func agentResumeCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "resume NAME",
		Short: "Continue a paused sandbox, or restore a suspended one with its processes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := e.svc().Resume(e.ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s running\n", args[0])
			return nil
		},
	}
}

func agentSuspendCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "suspend NAME",
		Short: "Save a sandbox's memory and processes to disk and free its RAM (`smx agent resume` restores it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			progress, end := e.progress("suspending " + name)
			r, err := e.svc().Suspend(e.ctx, name, progress)
			end()
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s suspended (%s of state in %d ms)\n", name, humanBytes(r.Bytes), r.DurationMS)
			return nil
		},
	}
}

// progress prints how much of a save has been written on one stderr
// line; end finishes the line.
func (e *env) progress(what string) (service.Progress, func()) {
	var mu sync.Mutex
	printed := false
	return func(n int64) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprintf(e.stderr, "\rsmx: %s: %s written", what, humanBytes(n))
			printed = true
		}, func() {
			mu.Lock()
			defer mu.Unlock()
			if printed {
				fmt.Fprintln(e.stderr)
			}
		}
}

func agentRestoreCmd(e *env) *cobra.Command {
	var name, profile, timeout, idleStop string
	var asJSON, keepPorts, external bool
	var ports []string
	cmd := &cobra.Command{
		Use:   "restore SNAPSHOT --name NEW",
		Short: "Start a new sandbox from a snapshot, with its memory, processes and disk (a fork)",
		Long: "Start a new sandbox from a snapshot: the guest continues where the snapshot was taken,\n" +
			"on its own copy-on-write disk, with fresh entropy, the current time and its own hostname.\n" +
			"Any number of sandboxes can be restored from one snapshot. Streams open at snapshot time\n" +
			"(exec sessions, guest TCP connections) do not survive. The snapshot's published ports\n" +
			"are not published again (its source may still hold them) unless --keep-ports says so;\n" +
			"-p publishes others. The new sandbox keeps the source's --timeout and --idle-stop\n" +
			"unless given here (0 removes one).",
		Example: "  smx agent restore snap1 --name try2\n" +
			"  smx agent restore snap1 --name try3 --timeout 30m --idle-stop 0   # its own limit, none for idleness",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			start := time.Now()
			in, err := e.svc().Restore(e.ctx, service.RestoreRequest{Snapshot: args[0], Name: name, Profile: profile,
				Ports: ports, KeepPorts: keepPorts, PublishExternal: external, Timeout: timeout, IdleStop: idleStop})
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, e.wireSandbox(in))
			}
			fmt.Fprintf(e.stdout, "%s %s (restored from %s in %d ms)\n", in.Spec.Name, in.State.Status, args[0], time.Since(start).Milliseconds())
			if len(in.Spec.Ports) > 0 {
				e.printPorts(e.stdout, in.Spec.Name, "")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the new sandbox as JSON")
	cmd.Flags().StringVar(&name, "name", "", "name of the new sandbox (required)")
	cmd.Flags().StringVar(&profile, "profile", "", "security profile for the new sandbox (default: the snapshot's)")
	cmd.Flags().BoolVar(&keepPorts, "keep-ports", false, "publish the snapshot's ports again on the new sandbox")
	cmd.Flags().StringVar(&timeout, "timeout", "", "stop the new sandbox once it has run this long (e.g. 30m; 0: none), instead of the source's limit")
	cmd.Flags().StringVar(&idleStop, "idle-stop", "", "stop it after this long with no exec, traffic or output (e.g. 15m; 0: none), instead of the source's")
	registerPublish(cmd, &ports, &external)
	return cmd
}

func newSnapshotCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Save and manage sandbox snapshots (memory, devices and disk)"}
	cmd.AddCommand(snapshotCreateCmd(e), snapshotLsCmd(e), snapshotInspectCmd(e), snapshotRmCmd(e), snapshotPushCmd(e), snapshotPullCmd(e))
	return cmd
}

func snapshotCreateCmd(e *env) *cobra.Command {
	var name string
	var stop, asJSON bool
	cmd := &cobra.Command{
		Use:   "create SANDBOX [--name SNAP] [--stop]",
		Short: "Snapshot a running sandbox; it keeps running unless --stop",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := service.SnapshotRequest{Sandbox: args[0], Name: name, Stop: stop}
			end := func() {}
			if !asJSON {
				// The name is the service's default when not given: say
				// the sandbox's instead while it saves.
				what := "saving " + name
				if name == "" {
					what = "saving " + args[0]
				}
				req.Progress, end = e.progress(what)
			}
			sn, err := e.svc().CreateSnapshot(e.ctx, req)
			end()
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, api.WireSnapshot(sn))
			}
			fmt.Fprintf(e.stdout, "%s (memory %s, disk %s, guest paused %d ms)\n", sn.Name,
				humanBytes(sn.MemoryStateBytes), humanBytes(sn.DiskFileBytes), sn.SaveMS)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "snapshot name (default: SANDBOX-DATE-TIME)")
	cmd.Flags().BoolVar(&stop, "stop", false, "stop the sandbox after the snapshot")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the snapshot's metadata as JSON")
	return cmd
}

func snapshotLsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List snapshots",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := e.svc().ListSnapshots(e.ctx)
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
			fmt.Fprintln(tw, "NAME\tSOURCE\tIMAGE\tMEMORY\tSTATE\tDISK\tCREATED")
			for _, sn := range list {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%dM\t%s\t%s\t%s\n", sn.Name, sn.Source, sn.Image, sn.MemoryMiB,
					humanBytes(sn.MemoryStateBytes), humanBytes(sn.DiskFileBytes), sn.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func snapshotInspectCmd(e *env) *cobra.Command {
	var asJSON, verify bool
	cmd := &cobra.Command{
		Use:   "inspect SNAP",
		Short: "Show a snapshot's metadata (--verify checks its digests)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sn, err := e.svc().InspectSnapshot(e.ctx, args[0], verify)
			if err != nil {
				return err
			}
			if asJSON {
				w := api.WireSnapshot(sn)
				w.Verified = verify
				return writeJSON(e.stdout, w)
			}
			w := e.stdout
			fmt.Fprintf(w, "Name:      %s\nSource:    %s\nParent:    %s\nCreated:   %s\nImage:     %s %s\nProfile:   %s %s\n",
				sn.Name, sn.Source, sn.Parent, sn.Created.Local().Format(time.RFC3339), sn.Image, sn.ImageDigest, sn.Profile, sn.ProfileHash)
			fmt.Fprintf(w, "Guest:     %d CPUs, %d MiB, disk %s\nQEMU:      %s\nKernel:    %s\nInitramfs: %s\nAccel:     %s\n",
				sn.CPUs, sn.MemoryMiB, humanBytes(sn.DiskBytes), sn.QEMUVersion, sn.Kernel, sn.InitramfsHash, sn.Accel)
			if sn.Machine != "" {
				// What another host needs to restore it (the flags: under KVM).
				fmt.Fprintf(w, "Machine:   %s, -cpu %s", sn.Machine, sn.CPU)
				if len(sn.CPUFlags) > 0 {
					fmt.Fprintf(w, " with %d host CPU flags", len(sn.CPUFlags))
				}
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "Memory:    %s %s\nDisk:      %s %s\nPaused:    %d ms\nDir:       %s\n",
				humanBytes(sn.MemoryStateBytes), sn.MemoryDigest, humanBytes(sn.DiskFileBytes), sn.DiskDigest, sn.SaveMS, sn.Dir)
			if verify {
				fmt.Fprintln(w, "Verified:  memory and disk layers match their digests")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().BoolVar(&verify, "verify", false, "check the memory state and disk layers against their digests")
	return cmd
}

func snapshotRmCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "rm SNAP...",
		Short: "Remove snapshots (refused while a sandbox restored from one exists)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			done, err := e.svc().RemoveSnapshots(e.ctx, args)
			for _, n := range done {
				fmt.Fprintln(e.stdout, n)
			}
			return err
		},
	}
}
