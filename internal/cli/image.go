package cli

import (
	"context"
	"fmt"
	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/service"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func newImageCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Build, import, list and remove guest images"}
	cmd.AddCommand(imageBuildCmd(e), imageImportCmd(e), imageLsCmd(e), imageRmCmd(e))
	cmd.AddCommand(imagePresetCmd(e), imagePullCmd(e)) // imagepreset.go, imagepull.go
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
			ctx, cancel := e.interruptible()
			defer cancel()
			img, err := e.svc().BuildImage(ctx, service.ImageBuildRequest{
				Name: args[0], From: from, Packages: strings.Split(packages, ","), Progress: e.stderr,
			})
			if err != nil {
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
		Use:   "import NAME docker-archive:FILE|oci-layout:DIR|dir:ROOTFS",
		Short: "Import an OCI image (flattened, whiteouts applied)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := e.interruptible()
			defer cancel()
			img, err := e.svc().ImportImage(ctx, service.ImageImportRequest{Name: args[0], Ref: args[1], Progress: e.stderr})
			if err != nil {
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
			list, err := e.svc().ListImages(e.ctx)
			if err != nil {
				return err
			}
			if asJSON {
				out := []wire.Image{}
				for i := range list {
					out = append(out, *api.WireImage(&list[i]))
				}
				return writeJSON(e.stdout, out)
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
			if err := e.svc().RemoveImage(e.ctx, args[0]); err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, args[0])
			return nil
		},
	}
}
