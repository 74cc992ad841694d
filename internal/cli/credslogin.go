package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

// credsLoginCmd stores the model API key a preset's credential binding
// names, so `smx agent run PRESET` finds it. The key stays on the host: the
// guest gets the preset's placeholder and the gateway swaps in the key on
// model requests.
func credsLoginCmd(e *env) *cobra.Command {
	var fromEnv, fromFile string
	var doImport bool
	cmd := &cobra.Command{
		Use:   "login PRESET [--from-env VAR | --import [--from-file F]]",
		Short: "Store the model API key for an agent preset (claude, codex, gemini); it never enters a sandbox",
		Long: "Store the API key the preset's profile sends to its model API. Without\n" +
			"--from-env it is read from the terminal without echo, or from stdin when\n" +
			"that is not a terminal. The key is kept in the host-side store under the\n" +
			"preset's secret name (`smx creds ls`). With --import, the host user's own\n" +
			"subscription sign-in is taken from the agent's config (~/.claude/.credentials.json,\n" +
			"~/.codex/auth.json, ~/.gemini/oauth_creds.json):\n" +
			"the host refreshes it before it expires and the guest gets a placeholder sign-in.\n" +
			"The agent's own CLI on the host and smx then share one refresh token; if one\n" +
			"refreshes it the other may have to sign in again.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if doImport {
				r, err := e.svc().ImportSignIn(e.ctx, args[0], fromFile)
				if err != nil {
					return err
				}
				what := ""
				if r.What != "" {
					what = " (" + r.What + ")"
				}
				fmt.Fprintf(e.stdout, "%s: sign-in%s imported from %s as %s; the host refreshes it (expires %s); the guest gets a placeholder\n",
					r.Preset, what, r.File, r.Secret, r.Expires.Local().Format(time.DateTime))
				return nil
			}
			// The preset is checked before a key is asked for.
			p, err := e.svc().GetPreset(args[0])
			if err != nil {
				return err
			}
			if p.Credential == nil {
				return fmt.Errorf("preset %s uses no model credential: %w", p.Name, errdefs.ErrInvalid)
			}
			var val []byte
			switch {
			case fromEnv != "":
				v, ok := os.LookupEnv(fromEnv)
				if !ok || v == "" {
					return fmt.Errorf("environment variable %s is not set: %w", fromEnv, errdefs.ErrInvalid)
				}
				val = []byte(v)
			default:
				if fd, isTerm := terminalFd(e.stdin); isTerm {
					fmt.Fprintf(e.stderr, "API key for %s (not echoed): ", p.Name)
					val, err = term.ReadPassword(fd)
					fmt.Fprintln(e.stderr)
					if err != nil {
						return err
					}
				} else {
					line, err := bufio.NewReader(io.LimitReader(e.stdin, service.MaxCredentialBytes+1)).ReadString('\n')
					if err != nil && !errors.Is(err, io.EOF) {
						return err
					}
					val = []byte(line)
				}
			}
			r, err := e.svc().SetPresetKey(e.ctx, p.Name, val)
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s: key stored as %s (%d bytes); `smx agent run %s` sends it as %s on model requests\n",
				r.Preset, r.Secret, r.Bytes, r.Preset, r.Header)
			return nil
		},
	}
	cmd.Flags().StringVar(&fromEnv, "from-env", "", "read the key from this environment variable")
	cmd.Flags().BoolVar(&doImport, "import", false, "import the host user's own sign-in of the agent (subscription) instead of an API key")
	cmd.Flags().StringVar(&fromFile, "from-file", "", "with --import: the agent's sign-in file (default: the preset's, under $HOME)")
	return cmd
}
