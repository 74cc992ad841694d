package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"smx/internal/errdefs"
	"smx/internal/image"
	"smx/internal/snapshot"
)

func newImageCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build, import, list and remove guest images"}
	cmd.AddCommand(imageBuildCmd(e), imageImportCmd(e), imageLsCmd(e), imageRmCmd(e))
	return cmd
}

// interruptible cancels long image work on Ctrl-C; the image store then
// removes its half-written build, so nothing half-made is ever listed.
func (e *env) interruptible() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
}

func imageBuildCmd(e *env) *cobra.Command {
	var from, packages string
	cmd := &cobra.Command{
		Use:   "build NAME --from busybox|debian [--packages a,b]",
		Short: "Build an image: busybox (seconds) or Debian bookworm (minutes, needs root)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.state.Ensure(); err != nil {
				return err
			}
			ctx, cancel := e.interruptible()
			defer cancel()
			var img *image.Image
			var err error
			switch from {
			case "busybox":
				if packages != "" {
					return fmt.Errorf("--packages applies to --from debian only: %w", errdefs.ErrInvalid)
				}
				img, err = e.images().BuildBusybox(ctx, args[0], e.stderr)
			case "debian":
				var pk []string
				for _, p := range strings.Split(packages, ",") {
					if p = strings.TrimSpace(p); p != "" {
						pk = append(pk, p)
					}
				}
				img, err = e.images().BuildDebian(ctx, args[0], pk, e.stderr)
			default:
				return fmt.Errorf("--from %q: use busybox or debian (or `smx image import` for OCI images): %w", from, errdefs.ErrInvalid)
			}
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("image build interrupted; nothing was kept")
				}
				return err
			}
			fmt.Fprintf(e.stdout, "%s %s\n", img.Name, img.Digest)
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "busybox", "base: busybox or debian")
	cmd.Flags().StringVar(&packages, "packages", "", "extra Debian packages, comma-separated")
	return cmd
}

func imageImportCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "import NAME docker-archive:FILE|oci-layout:DIR",
		Short: "Import an OCI image (flattened, whiteouts applied)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.state.Ensure(); err != nil {
				return err
			}
			ctx, cancel := e.interruptible()
			defer cancel()
			img, err := e.images().Import(ctx, args[0], args[1], e.stderr)
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("image import interrupted; nothing was kept")
				}
				return err
			}
			fmt.Fprintf(e.stdout, "%s %s\n", img.Name, img.Digest)
			return nil
		},
	}
}

func imageLsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := e.images().List()
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []image.Image{}
				}
				return writeJSON(e.stdout, list)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSOURCE\tSIZE\tON DISK\tDIGEST\tCREATED")
			for _, im := range list {
				d := im.Digest
				if len(d) > 19 {
					d = d[:19]
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", im.Name, im.Source, humanBytes(im.Size),
					humanBytes(im.DiskBytes), d, im.Created.Local().Format(time.DateTime))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func imageRmCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove an image (refused while a sandbox uses it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			err := e.images().Remove(args[0], func(name string) (bool, error) {
				used, err := e.manager().ImagesInUse()
				if err != nil || used[name] {
					return used[name], err
				}
				// A snapshot's disk layer is backed by the image's base.
				snaps, err := e.snapshots().List()
				for _, sn := range snaps {
					if sn.Image == name {
						return true, err
					}
				}
				return false, err
			})
			if err != nil {
				return err
			}
			// Its boot templates go with it (nothing uses them: every
			// sandbox or snapshot backed by one also uses the image).
			if err := e.removeTemplates(func(t *snapshot.Snapshot) bool { return t.Image == args[0] }); err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, args[0])
			return nil
		},
	}
}
