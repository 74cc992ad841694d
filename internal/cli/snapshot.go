package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"smx/internal/audit"
	"smx/internal/errdefs"
	"smx/internal/sandbox"
	"smx/internal/snapshot"
	"smx/internal/statedir"
	"smx/internal/vm"
)

func (e *env) snapshots() *snapshot.Store { return &snapshot.Store{Dir: e.state.Snapshots()} }

// liveSandbox returns a sandbox whose supervisor runs (running or paused).
func (e *env) liveSandbox(name string) (*sandbox.Info, error) {
	in, err := e.manager().Get(name)
	if err != nil {
		return nil, err
	}
	switch in.State.Status {
	case sandbox.StatusRunning, sandbox.StatusPaused:
		return in, nil
	}
	msg := fmt.Sprintf("sandbox %s is %s", name, in.State.Status)
	if (in.State.Status == sandbox.StatusCrashed || in.State.Status == sandbox.StatusBlocked) && in.State.Error != "" {
		msg += " (" + in.State.Error + ")"
	}
	return nil, fmt.Errorf("%s: only a running or paused sandbox can be paused, suspended or snapshotted: %w", msg, errdefs.ErrFailed)
}

func agentPauseCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "pause NAME",
		Short: "Stop a sandbox's vCPUs; its memory stays in place (`smx agent resume` continues)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := e.liveSandbox(args[0]); err != nil {
				return err
			}
			c := &sandbox.Client{Paths: e.manager().Paths(args[0])}
			if _, err := c.Pause(e.ctx); err != nil {
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
			name := args[0]
			in, err := e.manager().Get(name)
			if err != nil {
				return err
			}
			switch in.State.Status {
			case sandbox.StatusPaused, sandbox.StatusBlocked:
				// For a blocked sandbox the supervisor retries the I/O that
				// stopped it, and says so if the disk is still full.
				c := &sandbox.Client{Paths: e.manager().Paths(name)}
				if _, err := c.Resume(e.ctx); err != nil {
					return err
				}
			case sandbox.StatusSuspended:
				// The supervisor finds suspend.state and loads it.
				if _, err := e.start(e.ctx, name); err != nil {
					return err
				}
			case sandbox.StatusRunning:
			default:
				return fmt.Errorf("sandbox %s is %s, not paused or suspended: start it with `smx agent start %s`: %w", name, in.State.Status, name, errdefs.ErrFailed)
			}
			fmt.Fprintf(e.stdout, "%s running\n", name)
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
			if _, err := e.liveSandbox(name); err != nil {
				return err
			}
			p := e.manager().Paths(name)
			stop := e.progress("suspending "+name, p.SuspendState()+".tmp")
			r, err := (&sandbox.Client{Paths: p}).Suspend(e.ctx)
			stop()
			if err != nil {
				return err
			}
			for sandbox.SupervisorAlive(p) {
				time.Sleep(20 * time.Millisecond)
			}
			fmt.Fprintf(e.stdout, "%s suspended (%s of state in %d ms)\n", name, humanBytes(r.Bytes), r.DurationMS)
			return nil
		},
	}
}

// progress prints how much of a save has been written, every second,
// once the save has taken more than a second; the returned func ends it.
func (e *env) progress(what, path string) func() {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		printed := false
		for {
			select {
			case <-done:
				if printed {
					fmt.Fprintln(e.stderr)
				}
				return
			case <-t.C:
				if fi, err := os.Stat(path); err == nil {
					fmt.Fprintf(e.stderr, "\rsmx: %s: %s written", what, humanBytes(fi.Size()))
					printed = true
				}
			}
		}
	}()
	return func() { close(done); <-finished }
}

func agentRestoreCmd(e *env) *cobra.Command {
	var name, profile string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "restore SNAPSHOT --name NEW",
		Short: "Start a new sandbox from a snapshot, with its memory, processes and disk (a fork)",
		Long: "Start a new sandbox from a snapshot: the guest continues where the snapshot was taken,\n" +
			"on its own copy-on-write disk, with fresh entropy, the current time and its own hostname.\n" +
			"Any number of sandboxes can be restored from one snapshot. Streams open at snapshot time\n" +
			"(exec sessions, guest TCP connections) do not survive.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return fmt.Errorf("restore needs --name for the new sandbox: %w", errdefs.ErrInvalid)
			}
			start := time.Now()
			in, err := e.restore(args[0], name, profile)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, e.listEntry(*in))
			}
			fmt.Fprintf(e.stdout, "%s %s (restored from %s in %d ms)\n", in.Spec.Name, in.State.Status, args[0], time.Since(start).Milliseconds())
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the new sandbox as JSON")
	cmd.Flags().StringVar(&name, "name", "", "name of the new sandbox (required)")
	cmd.Flags().StringVar(&profile, "profile", "", "security profile for the new sandbox (default: the snapshot's)")
	return cmd
}

// restore creates sandbox name from snapshot snapName and starts it.
func (e *env) restore(snapName, name, profile string) (*sandbox.Info, error) {
	if err := sandbox.ValidName(name); err != nil {
		return nil, err
	}
	store := e.snapshots()
	sn, err := store.Get(snapName)
	if err != nil {
		return nil, err
	}
	// Refuse early, with the reason, when this host cannot load the state;
	// the supervisor checks the kernel and initramfs again when it boots.
	if v, err := vm.QEMUVersion(e.ctx, ""); err != nil {
		return nil, err
	} else if v != sn.QEMUVersion {
		return nil, fmt.Errorf("snapshot %s was saved by %q but this host runs %q: a saved state only restores on the same QEMU build: %w", sn.Name, sn.QEMUVersion, v, errdefs.ErrFailed)
	}
	// The state and every disk layer are checked against their digests:
	// a corrupt or altered snapshot is never loaded.
	if err := store.Verify(sn); err != nil {
		return nil, err
	}
	profName, profHash := sn.Profile, sn.ProfileHash
	profYAML, err := os.ReadFile(sn.ProfilePath())
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: profile: %w", sn.Name, err)
	}
	if profile != "" {
		prof, err := e.resolveProfile(profile)
		if err != nil {
			return nil, fmt.Errorf("--profile: %w", err)
		}
		if profYAML, err = prof.FrozenYAML(); err != nil {
			return nil, err
		}
		profName, profHash = profile, prof.Hash
	}

	// The fork mounts its source's host folders again (they must still
	// exist), deciding with its own profile.
	var mounts []sandbox.Mount
	for _, v := range sn.Mounts {
		mt, err := sandbox.ParseMount(v)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", sn.Name, err)
		}
		mounts = append(mounts, mt)
	}

	m := e.manager()
	lock, err := m.LockAll()
	if err != nil {
		return nil, err
	}
	p, err := m.Create(sandbox.Spec{
		Name: name, Image: sn.Image, ImageBase: sn.ImageBase, Mounts: mounts,
		CPUs: sn.CPUs, MemoryMiB: sn.MemoryMiB, DiskBytes: sn.DiskBytes,
		Accel: sn.Accel, Env: sn.Env, Created: time.Now().UTC(),
		Profile: profName, ProfileHash: profHash, Snapshot: sn.Name, Kernel: sn.Kernel,
	})
	if err != nil {
		lock.Unlock()
		return nil, err
	}
	err = statedir.WriteFileAtomic(p.Profile(), profYAML, 0o600)
	if err == nil {
		err = snapshot.ForkDisk(e.ctx, sn.DiskPath(), p.Disk())
	}
	if err != nil {
		m.Remove(name)
		lock.Unlock()
		return nil, err
	}
	fields := map[string]any{
		"snapshot": sn.Name, "snapshot_source": sn.Source, "image": sn.Image, "image_digest": sn.ImageDigest,
		"profile": profName, "profile_hash": profHash,
		"cpus": sn.CPUs, "memory_mib": sn.MemoryMiB, "disk_bytes": sn.DiskBytes,
	}
	if profHash != sn.ProfileHash {
		fields["snapshot_profile"], fields["snapshot_profile_hash"] = sn.Profile, sn.ProfileHash
	}
	e.logEvent(name, audit.KindSandboxCreate, fields)
	lock.Unlock()
	return e.start(e.ctx, name)
}

func newSnapshotCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Save and manage sandbox snapshots (memory, devices and disk)"}
	cmd.AddCommand(snapshotCreateCmd(e), snapshotLsCmd(e), snapshotInspectCmd(e), snapshotRmCmd(e))
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
			src := args[0]
			if _, err := e.liveSandbox(src); err != nil {
				return err
			}
			if name == "" {
				name = src + "-" + time.Now().Format("20060102-150405")
			}
			if err := snapshot.ValidName(name); err != nil {
				return err
			}
			if _, err := e.snapshots().Get(name); err == nil {
				return fmt.Errorf("snapshot %s: %w: pick another --name", name, errdefs.ErrExists)
			}
			p := e.manager().Paths(src)
			stopProgress := func() {}
			if !asJSON {
				stopProgress = e.progress("saving "+name, filepath.Join(e.snapshots().TempDir(name), "memory.state"))
			}
			_, err := (&sandbox.Client{Paths: p}).Snapshot(e.ctx, name, stop)
			stopProgress()
			if err != nil {
				return err
			}
			if stop {
				for sandbox.SupervisorAlive(p) {
					time.Sleep(20 * time.Millisecond)
				}
			}
			sn, err := e.snapshots().Get(name)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, sn)
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
			list, err := e.snapshots().List()
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []snapshot.Snapshot{}
				}
				return writeJSON(e.stdout, list)
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
			sn, err := e.snapshots().Get(args[0])
			if err != nil {
				return err
			}
			if verify {
				if err := e.snapshots().Verify(sn); err != nil {
					return err
				}
			}
			if asJSON {
				return writeJSON(e.stdout, sn)
			}
			w := e.stdout
			fmt.Fprintf(w, "Name:      %s\nSource:    %s\nParent:    %s\nCreated:   %s\nImage:     %s %s\nProfile:   %s %s\n",
				sn.Name, sn.Source, sn.Parent, sn.Created.Local().Format(time.RFC3339), sn.Image, sn.ImageDigest, sn.Profile, sn.ProfileHash)
			fmt.Fprintf(w, "Guest:     %d CPUs, %d MiB, disk %s\nQEMU:      %s\nKernel:    %s\nInitramfs: %s\nAccel:     %s\n",
				sn.CPUs, sn.MemoryMiB, humanBytes(sn.DiskBytes), sn.QEMUVersion, sn.Kernel, sn.InitramfsHash, sn.Accel)
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
			m := e.manager()
			// Under the sandboxes lock, so no restore creates a user of the
			// snapshot while it is being removed.
			lock, err := m.LockAll()
			if err != nil {
				return err
			}
			defer lock.Unlock()
			inUse := func(snap string) ([]string, error) {
				list, err := m.List()
				if err != nil {
					return nil, err
				}
				var users []string
				for _, in := range list {
					if in.Spec.Snapshot == snap {
						users = append(users, "sandbox "+in.Spec.Name)
					}
				}
				return users, nil
			}
			var errs []error
			for _, n := range args {
				if err := e.snapshots().Remove(n, inUse); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(e.stdout, n)
			}
			return errors.Join(errs...)
		},
	}
}
