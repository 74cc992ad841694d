package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

func imagePresetCmd(e *env) *cobra.Command {
	var docker bool
	cmd := &cobra.Command{
		Use:   "preset PRESET",
		Short: "Build (or find) a preset's image and print its name; `smx agent run` does this by itself",
		Long: "Build the image of an agent preset from its recipe (Debian bookworm, its Debian\n" +
			"packages, its npm packages at pinned versions), unless the store already holds\n" +
			"one for the same recipe: images are named PRESET-RECIPEHASH. Needs root.\n" +
			"With --docker, the image `smx agent run PRESET --docker` uses.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := e.svc().GetPreset(args[0])
			if err != nil {
				return err
			}
			if docker {
				if p, err = p.WithDocker(); err != nil {
					return err
				}
			}
			if err := e.state.Ensure(); err != nil {
				return err
			}
			ctx, cancel := e.interruptible()
			defer cancel()
			img, err := e.svc().PresetImage(ctx, p, e.presetProgress)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s %s\n", img.Name, img.Digest)
			return nil
		},
	}
	cmd.Flags().BoolVar(&docker, "docker", false, "the preset's image with Docker Engine added (as `agent run --docker` uses)")
	return cmd
}
