package cli

import (
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/service"
)

func imagePullCmd(e *env) *cobra.Command {
	var as string
	cmd := &cobra.Command{
		Use:   "pull REF [--name NAME]",
		Short: "Pull an OCI image from a registry (linux/amd64) and flatten it into an smx image",
		Long: "Pull REF (NAME[:TAG] or NAME@sha256:...) from its registry, verify it, flatten its\n" +
			"layers into an ext4 image and store it as NAME (default: from REF, e.g.\n" +
			"debian:bookworm -> debian-bookworm). The digest pulled is printed: use\n" +
			"REF@sha256:... to get exactly the same image again. Registry logins are\n" +
			"read from Docker's config (docker login).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if as == "" {
				as = imageNameFromRef(args[0])
			}
			ctx, cancel := e.interruptible()
			defer cancel()
			res, err := e.svc().PullImage(ctx, service.ImagePullRequest{Name: as, Ref: args[0], Progress: e.stderr})
			if err != nil {
				if ctx.Err() != nil {
					return fmt.Errorf("image pull interrupted; nothing was kept")
				}
				return err
			}
			fmt.Fprintf(e.stderr, "pulled %s\n", res.Pinned)
			fmt.Fprintf(e.stdout, "%s %s\n", res.Image.Name, res.Image.Digest)
			return nil
		},
	}
	cmd.Flags().StringVar(&as, "name", "", "name of the new image (default: from REF)")
	return cmd
}

var imageNameJunk = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[^a-z0-9._-]+`) })

// imageNameFromRef names an image after its reference's last path element
// and tag (or the digest's first 12 hex digits).
func imageNameFromRef(ref string) string {
	r := strings.ToLower(ref)
	tag := ""
	if i := strings.Index(r, "@sha256:"); i >= 0 {
		d := r[i+len("@sha256:"):]
		tag, r = d[:min(12, len(d))], r[:i]
	}
	if i := strings.LastIndex(r, ":"); i > strings.LastIndex(r, "/") {
		if tag == "" {
			tag = r[i+1:]
		}
		r = r[:i]
	}
	base := r[strings.LastIndex(r, "/")+1:]
	n := base
	if tag != "" {
		n += "-" + tag
	}
	n = strings.Trim(imageNameJunk().ReplaceAllString(n, "-"), "-._")
	if len(n) > 63 {
		n = n[:63]
	}
	if n == "" {
		n = "pulled"
	}
	return n
}
