package cli

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/service"
)

func (e *env) resolveProfile(ref string) (*policy.Profile, error) { return e.svc().ResolveProfile(ref) }

func newProfileCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "profile", Short: "Inspect, check and query security profiles"}
	cmd.AddCommand(profileLsCmd(e), profileShowCmd(e), profileCheckCmd(e), profileExplainCmd(e), profileLearnCmd(e), profileDiffCmd(e))
	return cmd
}

func profileLsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List built-in profiles and those in the state directory's profiles/ folder",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			rows, err := e.svc().ListProfiles(e.ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, rows)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tNETWORK\tSOURCE\tHASH")
			for _, r := range rows {
				h := r.Hash
				if len(h) > 19 {
					h = h[:19]
				}
				if r.Error != "" {
					h = r.Error
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, r.Mode, r.Source, h)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func profileShowCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "show NAME|FILE",
		Short: "Print a profile as resolved (extends applied, defaults filled in)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := e.svc().ShowProfile(e.ctx, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "# %s (%s) %s\n", p.Name, p.Source, p.Hash)
			_, err = io.WriteString(e.stdout, p.YAML)
			return err
		},
	}
}

func profileCheckCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "check FILE...",
		Short: "Validate profile files; every problem is reported as file:line:col",
		Long: "Validate profile files; every problem is reported as file:line:col and fails the\n" +
			"check. A valid profile may still name something in vain: a forge in git rules or\n" +
			"a forge credential that the network rules do not let the guest reach over HTTPS\n" +
			"(git rules open no network path) is a warning on stderr.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			bad := 0
			for _, f := range args {
				c := e.svc().CheckProfile(e.ctx, f)
				if !c.OK {
					bad++
					for _, p := range c.Problems {
						fmt.Fprintln(e.stderr, p)
					}
					continue
				}
				for _, w := range c.Warnings {
					fmt.Fprintln(e.stderr, w)
				}
				fmt.Fprintf(e.stdout, "%s: ok (%s)\n", f, c.Hash)
			}
			if bad > 0 {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
}

func profileExplainCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "explain NAME|FILE REQUEST | explain NAME|FILE ssh USER@HOST[:PORT]",
		Short: "Say whether a profile allows a request, by which rule, and why",
		Long: "REQUEST is one of:\n" +
			"  https://api.example.com/v1       tcp:10.0.0.5:5432       udp:1.1.1.1:53\n" +
			"  file:rw:/work/app/.env           git:push:github.com/acme/app:refs/heads/main\n" +
			"  ssh:deploy@build1:22             (also as two words: ssh deploy@build1:22)\n" +
			"  git read|push|delete|force-push REPO [REF]   (REPO as a URL or forge/owner/name)\n" +
			"Exits 0 when allowed, 1 when denied or asked (the verdict reads ask: the\n" +
			"gateway would hold the request until the host user answers; see smx approvals).",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) >= 2 && args[1] == "git" {
				return cobra.RangeArgs(4, 5)(cmd, args)
			}
			return cobra.RangeArgs(2, 3)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 3 && args[1] != "git" {
				args = []string{args[0], args[1] + ":" + args[2]}
			}
			xreq := service.ExplainRequest{Profile: args[0], Request: args[1]}
			if args[1] == "git" {
				xreq = service.ExplainRequest{Profile: args[0], Git: args[2:]}
			}
			x, err := e.svc().ExplainProfile(e.ctx, xreq)
			if err != nil {
				return err
			}
			p, req, d := x.Resolved, x.Parsed, x
			if asJSON {
				out := map[string]any{
					"profile": p.Name, "request": req.String(), "allow": d.Allow, "rule": d.Rule, "reason": d.Reason,
				}
				if d.Ask {
					out["ask"] = true
				}
				if err := writeJSON(e.stdout, out); err != nil {
					return err
				}
			} else {
				verdict := "deny"
				switch {
				case d.Allow:
					verdict = "allow"
				case d.Ask:
					verdict = "ask"
				}
				fmt.Fprintf(e.stdout, "%-6s %s\nrule   %s\nreason %s\n", verdict, req.String(), d.Rule, d.Reason)
				if c, ok := p.CredentialFor(req); ok && d.Allow {
					switch {
					case req.Kind == policy.KindGit:
						fmt.Fprintf(e.stdout, "credential %s (secret %s) is sent to %s by the Git gateway\n", c.Name, c.From, c.Forge)
					case req.Kind == policy.KindNet && c.HasMatchers():
						path := "/"
						if u, err := url.Parse(args[1]); err == nil && u.EscapedPath() != "" {
							path = u.EscapedPath()
						}
						if c.MatchRequest("GET", path, nil) {
							fmt.Fprintf(e.stdout, "credential %s (secret %s) is sent with GET %s\n", c.Name, c.From, path)
						} else {
							fmt.Fprintf(e.stdout, "credential %s is not sent with GET %s (outside its methods, paths or headers)\n", c.Name, path)
						}
					case req.Kind == policy.KindNet:
						fmt.Fprintf(e.stdout, "credential %s (secret %s) is sent with every request\n", c.Name, c.From)
					}
				}
				if req.Kind == policy.KindSSH {
					explainSSH(e.stdout, p, req)
				}
				if req.Kind == policy.KindGit && d.Allow {
					explainForgeReach(e.stdout, p, req)
				}
			}
			if !d.Allow {
				return &ExitError{Code: 1}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// explainForgeReach says when the guest cannot reach the forge of an
// allowed Git request: git rules open no network path to it.
func explainForgeReach(w io.Writer, p *policy.Profile, req policy.Request) {
	forge, _, _ := strings.Cut(req.Repo, "/")
	if nd := p.Decide(policy.Request{Kind: policy.KindNet, Proto: "tcp", Host: forge, Port: 443}); !nd.Allow {
		fmt.Fprintf(w, "but the guest cannot reach %s: the network rules refuse HTTPS to it (%s); git rules open no network path\n", forge, nd.Reason)
	}
}

func newCredsCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "creds", Short: "Manage host-side secrets (never shown again, never sent into a sandbox)"}
	store := func() creds.Store { return creds.Store{Dir: e.state.Creds()} }
	var fromEnv, fromFile string
	set := &cobra.Command{
		Use:   "set NAME [--from-env VAR | --from-file F]",
		Short: "Store a secret (from an environment variable, a file, or stdin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fromEnv != "" && fromFile != "" {
				return fmt.Errorf("use one of --from-env and --from-file: %w", errdefs.ErrInvalid)
			}
			var val []byte
			switch {
			case fromEnv != "":
				v, ok := os.LookupEnv(fromEnv)
				if !ok {
					return fmt.Errorf("environment variable %s is not set: %w", fromEnv, errdefs.ErrInvalid)
				}
				val = []byte(v)
			case fromFile != "":
				b, err := os.ReadFile(fromFile)
				if err != nil {
					return fmt.Errorf("creds: %w", err)
				}
				val = b
			default:
				if fd, isTerm := terminalFd(e.stdin); isTerm {
					// A secret typed at a terminal is not echoed.
					fmt.Fprintf(e.stderr, "value for %s (not shown; end with Enter): ", args[0])
					b, err := term.ReadPassword(fd)
					fmt.Fprintln(e.stderr)
					if err != nil {
						return fmt.Errorf("creds: read the value: %w", err)
					}
					val = b
				} else {
					b, err := io.ReadAll(io.LimitReader(e.stdin, creds.MaxValue+1))
					if err != nil {
						return err
					}
					val = b
				}
			}
			// A trailing newline from `echo` or a file is never part of a token.
			val = []byte(strings.TrimRight(string(val), "\r\n"))
			if err := e.state.Ensure(); err != nil {
				return err
			}
			if err := store().Set(args[0], val); err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s stored (%d bytes)\n", args[0], len(val))
			return nil
		},
	}
	set.Flags().StringVar(&fromEnv, "from-env", "", "read the value from this environment variable")
	set.Flags().StringVar(&fromFile, "from-file", "", "read the value from this file")
	var asJSON bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List secrets by name (values are never printed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := store().List()
			if err != nil {
				return err
			}
			if asJSON {
				if list == nil {
					list = []creds.Info{}
				}
				return writeJSON(e.stdout, list)
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tBYTES\tSHA256\tUPDATED")
			for _, c := range list {
				fmt.Fprintf(tw, "%s\t%d\t%s…\t%s\n", c.Name, c.Bytes, c.SHA256Prefix, c.Updated.Local().Format("2006-01-02 15:04:05"))
			}
			return tw.Flush()
		},
	}
	ls.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Delete secrets",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var errs []error
			for _, n := range args {
				if err := store().Remove(n); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(e.stdout, n)
			}
			return errors.Join(errs...)
		},
	}
	cmd.AddCommand(set, ls, rm)
	cmd.AddCommand(credsLoginCmd(e)) // credslogin.go
	return cmd
}

func agentPolicyCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "policy NAME PROFILE",
		Short: "Change a sandbox's security profile; a running sandbox follows it at once",
		Long: "Resolve PROFILE (built-in, name or file), freeze it into the sandbox and, if the\n" +
			"sandbox runs, apply it: new flows follow it at once, live flows it no longer\n" +
			"allows are closed. The change is logged with both profile hashes.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, ref := args[0], args[1]
			r, err := e.svc().SetPolicy(e.ctx, service.PolicyRequest{Name: name, Profile: ref})
			if err != nil {
				return err
			}
			if r.Applied {
				fmt.Fprintf(e.stdout, "%s: profile %s (%s) applied; %d live flow(s) closed\n", name, ref, r.Hash[:19], r.ClosedFlows)
				return nil
			}
			fmt.Fprintf(e.stdout, "%s: profile %s (%s) set; applies from the next start\n", name, ref, r.Hash[:19])
			return nil
		},
	}
}
