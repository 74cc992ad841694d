package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

// `smx profile learn` and `smx profile diff`.

func profileLearnCmd(e *env) *cobra.Command {
	var logDir, keyFile, out, name string
	var force, refused, asJSON bool
	cmd := &cobra.Command{
		Use:   "learn SANDBOX | --log DIR",
		Short: "Write the smallest profile that allows what a sandbox's run did, from its verified log",
		Long: "Read a sandbox's log (or --log DIR, a copy of a log directory), verify its hash chain\n" +
			"and signed checkpoints, and write the smallest profile that would have allowed what\n" +
			"the run did: network names and ports (a *.parent wildcard only where the run reached\n" +
			"two or more names under one parent), the paths it wrote (DIR/** for a directory it\n" +
			"created or wrote three or more paths in), Git repos and refs, SSH hosts and the\n" +
			"credentials used. Each rule's comment names the records it came from. Refused actions\n" +
			"are left out unless --include-refused (never the built-in refusals). A log that does\n" +
			"not verify is refused. Run the agent under `open` (or a profile that asks) first.",
		Args: func(cmd *cobra.Command, args []string) error {
			if logDir != "" {
				return cobra.NoArgs(cmd, args)
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			req := service.LearnRequest{LogDir: logDir, ProfileName: name, Refused: refused}
			if len(args) == 1 {
				req.Name = args[0]
			}
			if keyFile != "" {
				b, err := os.ReadFile(keyFile)
				if err != nil {
					return err
				}
				req.PublicKey = string(b)
			}
			if out != "" && !force {
				// Checked before learning, so a refusal costs nothing.
				if _, err := os.Lstat(out); err == nil {
					return fmt.Errorf("%s exists: add --force to replace it: %w", out, errdefs.ErrExists)
				}
			}
			res, err := e.svc().LearnProfile(e.ctx, req)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, res)
			}
			for _, n := range res.Notes {
				fmt.Fprintf(e.stderr, "smx: note: %s\n", n)
			}
			if out == "" {
				_, err := fmt.Fprint(e.stdout, res.YAML)
				return err
			}
			if err := writeNew(out, []byte(res.YAML), force); err != nil {
				return err
			}
			fmt.Fprintf(e.stderr, "smx: wrote %s (%s) from %d signed records; check it with `smx profile check %s`\n",
				out, ruleCounts(res.Rules), res.Records, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&logDir, "log", "", "learn from a copy of a log directory instead of a sandbox's")
	if f := cmd.Flags().Lookup("log"); f != nil {
		f.Value = wordValue{f.Value, "DIR"} // --help: "--log DIR"
	}
	cmd.Flags().StringVar(&keyFile, "key-file", "", "verify the log against a public key kept elsewhere (from `smx agent logs --key`)")
	cmd.Flags().StringVarP(&out, "output", "o", "", "write the profile to FILE instead of stdout (never replaces one without --force)")
	cmd.Flags().BoolVar(&force, "force", false, "with -o: replace an existing file")
	cmd.Flags().StringVar(&name, "name", "", "the learned profile's name (default: none, the file name names it)")
	cmd.Flags().BoolVar(&refused, "include-refused", false, "also allow what the run was refused (not the built-in refusals)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON: the profile's YAML, notes and rule counts")
	return cmd
}

// writeNew writes b to path: a new file, or with force a replacement
// (written beside it and renamed, so a reader never sees half of it).
func writeNew(path string, b []byte, force bool) error {
	if !force {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists: add --force to replace it: %w", path, errdefs.ErrExists)
		}
		if err != nil {
			return err
		}
		if _, err := f.Write(b); err != nil {
			f.Close()
			os.Remove(path)
			return err
		}
		return f.Close()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func ruleCounts(m map[string]int) string {
	var parts []string
	for _, s := range []string{"network", "files", "git", "ssh", "credentials"} {
		if m[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", m[s], s))
		}
	}
	if len(parts) == 0 {
		return "no rules: the run reached nothing"
	}
	return strings.Join(parts, ", ") + " rules"
}

func profileDiffCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "diff A B",
		Short: "Show what profile B adds to profile A and what it removes, rule by rule",
		Long: "Compare two profiles (built-in names, names in the state directory's profiles/, or\n" +
			"files) as resolved, rule by rule: + for a rule B has and A has not, - for one A has\n" +
			"and B has not. The order of rules is not a difference. Exit status as diff's: 0 the\n" +
			"same, 1 different, 2 trouble. E.g. `smx profile diff team.yaml learned.yaml`.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return &ExitError{Code: 2, Err: fmt.Errorf("profile diff takes two profiles, A and B: see `smx profile diff --help`")}
			}
			var ps [2]*service.Profile
			for i, ref := range args {
				p, err := e.svc().ResolveProfile(ref)
				if err != nil {
					return &ExitError{Code: 2, Err: errors.New(userMessage(err.Error()))}
				}
				ps[i] = p
			}
			changes := service.DiffProfiles(ps[0], ps[1])
			if asJSON {
				if changes == nil {
					changes = []service.ProfileChange{}
				}
				if err := writeJSON(e.stdout, changes); err != nil {
					return &ExitError{Code: 2, Err: err}
				}
			} else {
				if len(changes) > 0 {
					fmt.Fprintf(e.stdout, "--- %s\n+++ %s\n", args[0], args[1])
				}
				for _, c := range changes {
					fmt.Fprintln(e.stdout, c)
				}
			}
			if len(changes) > 0 {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the changes as JSON: [{section, op, rule}]")
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &ExitError{Code: 2, Err: flagError(c, err)}
	})
	return cmd
}
