package cli

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/preset"
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
			p, err := preset.Get(args[0], preset.UserDir())
			if err != nil {
				return err
			}
			if p.Credential == nil {
				return fmt.Errorf("preset %s uses no model credential: %w", p.Name, errdefs.ErrInvalid)
			}
			store := creds.Store{Dir: e.state.Creds()}
			if doImport {
				return e.importSignIn(p, store, fromFile)
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
					line, err := bufio.NewReader(io.LimitReader(e.stdin, creds.MaxValue+1)).ReadString('\n')
					if err != nil && !errors.Is(err, io.EOF) {
						return err
					}
					val = []byte(line)
				}
			}
			val = []byte(strings.TrimSpace(string(val)))
			if len(val) == 0 {
				return fmt.Errorf("no key given: paste it at the prompt, pipe it in, or use --from-env VAR: %w", errdefs.ErrInvalid)
			}
			if err := e.state.Ensure(); err != nil {
				return err
			}
			if err := store.Set(p.Credential.Secret, val); err != nil {
				return err
			}
			// An API key replaces a sign-in stored before.
			if err := store.Remove(p.Credential.Secret + ".oauth"); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				return err
			}
			fmt.Fprintf(e.stdout, "%s: key stored as %s (%d bytes); `smx agent run %s` sends it as %s on model requests\n",
				p.Name, p.Credential.Secret, len(val), p.Name, p.Credential.Header)
			return nil
		},
	}
	cmd.Flags().StringVar(&fromEnv, "from-env", "", "read the key from this environment variable")
	cmd.Flags().BoolVar(&doImport, "import", false, "import the host user's own sign-in of the agent (subscription) instead of an API key")
	cmd.Flags().StringVar(&fromFile, "from-file", "", "with --import: the agent's sign-in file (default: the preset's, under $HOME)")
	return cmd
}

// importSignIn stores the host user's sign-in of the preset's agent.
func (e *env) importSignIn(p *preset.Preset, store creds.Store, file string) error {
	o := p.Credential.OAuth
	if o == nil {
		return fmt.Errorf("preset %s has no sign-in to import: store an API key instead: %w", p.Name, errdefs.ErrInvalid)
	}
	if file == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return err
		}
		file = filepath.Join(home, o.File)
	}
	var access, what string
	var oa creds.OAuth
	var err error
	switch o.Import {
	case "claude":
		access, oa, what, err = creds.ImportClaude(file, o.TokenURL, o.ClientID)
	case "codex":
		access, oa, what, err = creds.ImportCodex(file, o.TokenURL, o.ClientID)
	case "gemini":
		access, oa, err = creds.ImportGemini(file, o.TokenURL, o.ClientID, o.ClientSecret)
	}
	if err != nil {
		return err
	}
	if err := e.state.Ensure(); err != nil {
		return err
	}
	if err := store.SetOAuth(p.Credential.Secret, access, oa); err != nil {
		return err
	}
	if what != "" {
		what = " (" + what + ")"
	}
	fmt.Fprintf(e.stdout, "%s: sign-in%s imported from %s as %s; the host refreshes it (expires %s); the guest gets a placeholder\n",
		p.Name, what, file, p.Credential.Secret, oa.ExpiresAt.Local().Format(time.DateTime))
	return nil
}
