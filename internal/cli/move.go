package cli

import (
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/service"
)

// Moving sandboxes between hosts: snapshots as signed registry artifacts,
// and logs exported for verification elsewhere.

// transferProgress prints a long transfer's progress on one stderr line,
// at most a few times a second; end finishes the line.
func (e *env) transferProgress(what string) (func(n, total int64), func()) {
	var mu sync.Mutex
	var last time.Time
	printed := false
	return func(n, total int64) {
			mu.Lock()
			defer mu.Unlock()
			if time.Since(last) < 200*time.Millisecond && n < total {
				return
			}
			last = time.Now()
			fmt.Fprintf(e.stderr, "\rsmx: %s: %s of at most %s", what, humanBytes(n), humanBytes(total))
			printed = true
		}, func() {
			mu.Lock()
			defer mu.Unlock()
			if printed {
				fmt.Fprintln(e.stderr)
			}
		}
}

func snapshotPushCmd(e *env) *cobra.Command {
	return artifactPushCmd(e, "push SNAP REF", "Send a snapshot to a registry as an artifact signed by this host's log key",
		"Send a snapshot (memory state, disk layer, the image's base disk, frozen profile) to a registry\n"+
			"as an OCI artifact, signed by this host's log key (or --sign-key). Blobs the registry already\n"+
			"holds (the base disk after the first push) are not sent again. Logins come from Docker's config.\n"+
			"Another host pulls it with `smx snapshot pull` once it trusts this host's key (`smx logs export-key`).",
		func(name, ref string, f pushFlags, progress func(n, total int64)) (*service.PushResult, error) {
			return e.svc().PushSnapshot(e.ctx, service.PushSnapshotRequest{Snapshot: name, Ref: ref, SignKey: f.signKey,
				Compress: f.compress, WithKernel: f.withKernel, Progress: progress})
		})
}

// pushFlags are the flags snapshot push and template push share.
type pushFlags struct {
	asJSON, withKernel bool
	signKey, compress  string
}

// artifactPushCmd is a push command: push sends the local NAME to REF,
// with progress on stderr unless --json.
func artifactPushCmd(e *env, use, short, long string, push func(name, ref string, f pushFlags, progress func(n, total int64)) (*service.PushResult, error)) *cobra.Command {
	var f pushFlags
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var progress func(n, total int64)
			end := func() {}
			if !f.asJSON {
				progress, end = e.transferProgress("pushing " + args[0])
			}
			r, err := push(args[0], args[1], f, progress)
			end()
			if err != nil {
				return err
			}
			if f.asJSON {
				return writeJSON(e.stdout, r)
			}
			fmt.Fprintf(e.stdout, "%s@%s (sent %s of %s; memory %s as %s; signed by %s)\n", r.Ref, r.Digest,
				humanBytes(r.BytesSent), humanBytes(r.BytesTotal), humanBytes(r.MemoryBytes), humanBytes(r.MemoryStored), r.Signer)
			return nil
		},
	}
	cmd.Flags().BoolVar(&f.asJSON, "json", false, "print the result as JSON")
	cmd.Flags().StringVar(&f.signKey, "sign-key", "", "sign with the note signer key in this file instead of the host's log key")
	cmd.Flags().StringVar(&f.compress, "compress", "zstd", "compression of the memory layer: zstd or none")
	cmd.Flags().BoolVar(&f.withKernel, "with-kernel", false, "send the guest kernel along, for hosts that lack it (sent once per registry)")
	return cmd
}

func snapshotPullCmd(e *env) *cobra.Command {
	var asJSON bool
	var name string
	var keys []string
	cmd := &cobra.Command{
		Use:   "pull REF [--name SNAP]",
		Short: "Fetch a signed snapshot from a registry (`smx agent restore` starts it)",
		Long: "Fetch a snapshot artifact and store it as a local snapshot. It is refused, and nothing is\n" +
			"stored, unless it is signed by a key this host trusts (~/.config/smx/trusted-log-keys, or\n" +
			"--key FILE), every layer matches its signed digest, and this host has the guest kernel (by\n" +
			"digest) and the QEMU build its saved state needs.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := service.PullSnapshotRequest{Ref: args[0], Name: name, KeyFiles: keys}
			end := func() {}
			if !asJSON {
				req.Progress, end = e.transferProgress("pulling " + args[0])
			}
			r, err := e.svc().PullSnapshot(e.ctx, req)
			end()
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, r)
			}
			fmt.Fprintf(e.stdout, "%s (from %s@%s, %s, signed by %s)\n", r.Snapshot, r.Ref, r.Digest, humanBytes(r.Bytes), r.Signer)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	cmd.Flags().StringVar(&name, "name", "", "name of the local snapshot (default: the pushed one's)")
	cmd.Flags().StringArrayVar(&keys, "key", nil, "trust the verifier keys in this file too (repeatable)")
	return cmd
}

func templatePushCmd(e *env) *cobra.Command {
	return artifactPushCmd(e, "push TEMPLATE REF", "Send a boot template to a registry as an artifact signed by this host's log key",
		"Send a boot template (its memory state, disk layer and the image's base disk) to a registry,\n"+
			"signed like `smx snapshot push`. The private keys of the gateway CAs its guest trusts stay on\n"+
			"this host: sandboxes started from it elsewhere get CAs of their own, which their guests are made\n"+
			"to trust instead on the way up. `smx template pull REF` on each node, and first starts there with\n"+
			"the same image, shape, QEMU, kernel and smx restore it instead of booting.",
		func(name, ref string, f pushFlags, progress func(n, total int64)) (*service.PushResult, error) {
			return e.svc().PushTemplate(e.ctx, service.PushTemplateRequest{Template: name, Ref: ref, SignKey: f.signKey,
				Compress: f.compress, WithKernel: f.withKernel, Progress: progress})
		})
}

func templatePullCmd(e *env) *cobra.Command {
	var asJSON bool
	var keys []string
	cmd := &cobra.Command{
		Use:   "pull REF",
		Short: "Fetch a signed boot template from a registry; first starts with its inputs then restore it",
		Long: "Fetch a boot template artifact into this host's template store, with the checks of\n" +
			"`smx snapshot pull` (a trusted signature, every layer's digest, the guest kernel, QEMU build,\n" +
			"machine and CPU its state needs). It keeps its name, a hash of what its state depends on; a\n" +
			"template this host has already is not fetched again.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := service.PullTemplateRequest{Ref: args[0], KeyFiles: keys}
			end := func() {}
			if !asJSON {
				req.Progress, end = e.transferProgress("pulling " + args[0])
			}
			r, err := e.svc().PullTemplate(e.ctx, req)
			end()
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, r)
			}
			how := fmt.Sprintf("%s, signed by %s", humanBytes(r.Bytes), r.Signer)
			if r.Present {
				how = "present already"
			}
			fmt.Fprintf(e.stdout, "%s (from %s@%s, %s)\n", r.Snapshot, r.Ref, r.Digest, how)
			if !r.ImageOnHost {
				fmt.Fprintf(e.stderr, "smx: this host has no image %s of digest %s: sandboxes start from this template once it has (`smx image build` or `smx image pull`)\n", r.Image, r.ImageDigest)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the result as JSON")
	cmd.Flags().StringArrayVar(&keys, "key", nil, "trust the verifier keys in this file too (repeatable)")
	return cmd
}

func logsExportCmd(e *env) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "export NAME -o FILE",
		Short: "Bundle a sandbox's log with its checkpoints and public key for an auditor elsewhere",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" || out == "-" {
				return e.svc().ExportLog(e.ctx, args[0], e.stdout)
			}
			f, err := os.OpenFile(out, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				return err
			}
			if err := e.svc().ExportLog(e.ctx, args[0], f); err != nil {
				f.Close()
				os.Remove(out)
				return err
			}
			return f.Close()
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "write the bundle to FILE (default stdout)")
	return cmd
}

func logsVerifyCmd(e *env) *cobra.Command {
	var asJSON bool
	var keys []string
	cmd := &cobra.Command{
		Use:   "verify BUNDLE...",
		Short: "Verify exported log bundles and the links between them (a sandbox that moved hosts)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			reps, err := e.svc().VerifyLogBundles(e.ctx, args, keys)
			if asJSON && reps != nil {
				if werr := writeJSON(e.stdout, reps); werr != nil {
					return werr
				}
				return err
			}
			for _, r := range reps {
				trust := "trusted key"
				if !r.Trusted {
					trust = "UNTRUSTED key"
				}
				status := "verified"
				if !r.Report.OK() {
					status = "FAILED"
				}
				fmt.Fprintf(e.stdout, "%s: log %s (id %s): %d records %s, %s %s\n", r.File, r.Report.Sandbox, r.Report.LogID, r.Report.Records, status, trust, r.Key)
				for _, l := range r.Links {
					if l.Verified {
						fmt.Fprintf(e.stdout, "  record %d continues %s record %d (%s): verified\n", l.Seq, l.ToSandbox, l.ToSeq, l.ToHash)
					} else {
						fmt.Fprintf(e.stdout, "  record %d continues %s record %d: %s\n", l.Seq, l.ToSandbox, l.ToSeq, l.Problem)
					}
				}
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the reports as JSON")
	cmd.Flags().StringArrayVar(&keys, "key", nil, "trust the verifier keys in this file too (repeatable)")
	return cmd
}
