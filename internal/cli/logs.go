package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"smx/internal/audit"
	"smx/internal/errdefs"
)

// logEvent appends a record to a sandbox's log from the CLI. While a
// supervisor runs it owns the log (single writer) and records its own
// events; the CLI writes only when none does (create, remove). Failures
// are reported, not fatal: the operation itself already happened.
func (e *env) logEvent(name, kind string, fields map[string]any) {
	if err := e.state.Ensure(); err != nil {
		return
	}
	key, err := audit.LoadOrCreatePinnedKey(e.state.Audit())
	if err == nil {
		var l *audit.Log
		if l, err = audit.Open(audit.Dir(e.state.Logs(), name), name, key.Signer()); err == nil {
			_, err = l.Append(e.ctx, kind, fields)
			if cerr := l.Close(); err == nil {
				err = cerr
			}
		}
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "smx: warning: log %s for %s: %v\n", kind, name, err)
	}
}

func agentLogsCmd(e *env) *cobra.Command {
	var follow, refusals, asJSON, verify, showKey bool
	var since, keyFile string
	cmd := &cobra.Command{
		Use:   "logs NAME [--follow] [--refusals] [--since T] [--json] [--verify]",
		Short: "Read or verify a sandbox's tamper-evident log (kept after rm until `smx logs prune`)",
		Long: "Read a sandbox's hash-chained, signed log. --verify checks every record hash,\n" +
			"the chain, the Merkle tree against the latest signed checkpoint and its signature,\n" +
			"and names the first bad record. --key prints the public key to keep elsewhere;\n" +
			"--verify --key-file F verifies against such a kept key.\n" +
			"--since takes a duration (1h) or a time (RFC 3339).",
		Args: func(cmd *cobra.Command, args []string) error {
			if showKey && len(args) == 0 {
				return nil
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if showKey && !verify {
				k, err := audit.LoadOrCreatePinnedKey(e.state.Audit())
				if err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, k.PublicKey())
				return nil
			}
			name := args[0]
			dir := audit.Dir(e.state.Logs(), name)
			if _, err := os.Stat(dir); err != nil {
				return fmt.Errorf("no log for sandbox %s (`smx logs ls` lists logs): %w", name, errdefs.ErrNotFound)
			}
			if verify {
				return e.verifyLog(dir, keyFile, asJSON)
			}
			var f audit.Filter
			f.Refusals = refusals
			if since != "" {
				t, err := parseSince(since)
				if err != nil {
					return err
				}
				f.Since = t
			}
			print := func(r audit.Record) error {
				if asJSON {
					b, err := json.Marshal(r)
					if err != nil {
						return err
					}
					_, err = fmt.Fprintf(e.stdout, "%s\n", b)
					return err
				}
				_, err := fmt.Fprintln(e.stdout, formatRecord(r))
				return err
			}
			if follow {
				ctx, stop := signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
				defer stop()
				return audit.Follow(ctx, dir, f, print)
			}
			return audit.Scan(dir, f, print)
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new records")
	cmd.Flags().BoolVar(&refusals, "refusals", false, "only what policy refused")
	cmd.Flags().StringVar(&since, "since", "", "only records since a time (RFC 3339) or a duration ago (e.g. 1h)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, one record per line")
	cmd.Flags().BoolVar(&verify, "verify", false, "verify hashes, chain, tree and signed checkpoints")
	cmd.Flags().BoolVar(&showKey, "key", false, "print the log signing public key")
	cmd.Flags().StringVar(&keyFile, "key-file", "", "with --verify: a public key kept elsewhere (from --key)")
	return cmd
}

func (e *env) verifyLog(dir, keyFile string, asJSON bool) error {
	k, err := audit.LoadOrCreatePinnedKey(e.state.Audit())
	if err != nil {
		return err
	}
	verifier := k.Verifier()
	var keyProblem string
	if keyFile != "" {
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return err
		}
		if verifier, err = audit.ParseVerifier(strings.TrimSpace(string(b))); err != nil {
			return err
		}
	} else {
		file, pinned, err := e.pinnedKey()
		switch {
		case err != nil:
			return err
		case pinned == "":
			fmt.Fprintf(e.stderr, "smx: warning: the log signing key is not pinned, so a key replaced in %s would go unnoticed: run `smx logs export-key` to pin it in %s\n", e.state.Audit(), file)
		default:
			if verifier, err = audit.ParseVerifier(pinned); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			if pinned != k.PublicKey() {
				// Verify against the pin: checkpoints signed by the
				// replacement key then fail too, and are named.
				keyProblem = fmt.Sprintf("the signing key in %s is not the key pinned in %s: the key was replaced; checked against the pinned key", e.state.Audit(), file)
			}
		}
	}
	rep, err := audit.Verify(dir, verifier)
	if err != nil {
		return err
	}
	if keyProblem != "" {
		rep.Problems = append([]string{keyProblem}, rep.Problems...)
	}
	if asJSON {
		if err := writeJSON(e.stdout, rep); err != nil {
			return err
		}
	} else {
		fmt.Fprintln(e.stdout, rep.String())
	}
	if !rep.OK() {
		return &ExitError{Code: 1}
	}
	return nil
}

// pinnedKey returns the trusted keys file and the key it pins for this
// state directory ("" when none).
func (e *env) pinnedKey() (file, key string, err error) {
	if file, err = audit.TrustedKeysFile(); err != nil {
		return "", "", err
	}
	key, err = audit.Pinned(file, e.state.Audit())
	return file, key, err
}

func logsExportKeyCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "export-key",
		Short: "Print the log signing public key and pin it outside the state directory",
		Long: "Print the public key that signs this state directory's logs, to keep elsewhere\n" +
			"(`smx agent logs NAME --verify --key-file F` checks against such a copy), and pin it in\n" +
			"$XDG_CONFIG_HOME/smx/trusted-log-keys (default ~/.config/smx), which --verify checks\n" +
			"the state directory's key against. A key is pinned when it is created; this pins\n" +
			"keys created before pinning existed. A different pinned key is never replaced.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := audit.LoadOrCreatePinnedKey(e.state.Audit())
			if err != nil {
				return err
			}
			file, err := audit.TrustedKeysFile()
			if err != nil {
				return err
			}
			added, err := audit.Pin(file, e.state.Audit(), k.PublicKey())
			if errors.Is(err, errdefs.ErrDenied) {
				return fmt.Errorf("the log signing key in %s is not the one pinned in %s: it was replaced, or the pin is stale; check, then edit the pin by hand: %w",
					e.state.Audit(), file, errdefs.ErrDenied)
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, k.PublicKey())
			if added {
				fmt.Fprintf(e.stderr, "pinned in %s\n", file)
			}
			return nil
		},
	}
}

func parseSince(s string) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("invalid --since %q: use a duration like 30m or a time like 2026-01-02T15:04:05Z: %w", s, errdefs.ErrInvalid)
}

// formatRecord is one line a person reads: time, seq, kind, fields.
func formatRecord(r audit.Record) string {
	keys := make([]string, 0, len(r.Fields))
	for k := range r.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %6d %-16s", r.Time.Local().Format("2006-01-02 15:04:05.000"), r.Seq, r.Kind)
	for _, k := range keys {
		v, _ := json.Marshal(r.Fields[k])
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	return b.String()
}

// generatedName matches the names smx gives sandboxes created without one.
var generatedName = regexp.MustCompile(`^smx-[0-9a-f]{8}$`)

func newLogsCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "logs", Short: "Manage sandbox logs (list, prune)"}
	var lsAll bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List sandbox logs, including those of removed sandboxes",
		Long: "List sandbox logs, including those of removed sandboxes. The logs of `smx run`s\n" +
			"without --name are counted on one line; --all lists them too.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			names, err := audit.List(e.state.Logs())
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			unnamed := 0
			for _, n := range names {
				if !lsAll && generatedName.MatchString(n) {
					unnamed++
					continue
				}
				fmt.Fprintln(e.stdout, n)
			}
			if unnamed > 0 {
				fmt.Fprintf(e.stdout, "smx-*  (%d logs of runs without --name: `smx logs ls --all` lists them, `smx logs prune --all` removes them)\n", unnamed)
			}
			return nil
		},
	}
	ls.Flags().BoolVar(&lsAll, "all", false, "also list the logs of runs without --name one by one")
	var all bool
	prune := &cobra.Command{
		Use:   "prune NAME... | --all",
		Short: "Delete the logs of removed sandboxes (refused for existing ones)",
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) > 0) {
				return fmt.Errorf("name the logs to prune, or use --all: %w", errdefs.ErrInvalid)
			}
			if all {
				names, err := audit.List(e.state.Logs())
				if err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
				for _, n := range names {
					if _, err := e.manager().Get(n); err == nil {
						continue // the sandbox still exists
					}
					args = append(args, n)
				}
			}
			var errs []error
			for _, n := range args {
				if _, err := e.manager().Get(n); err == nil {
					errs = append(errs, fmt.Errorf("sandbox %s still exists: remove it first: %w", n, errdefs.ErrInUse))
					continue
				}
				if err := audit.Prune(e.state.Logs(), n); err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(e.stdout, n)
			}
			return errors.Join(errs...)
		},
	}
	prune.Flags().BoolVar(&all, "all", false, "prune the logs of every removed sandbox")
	cmd.AddCommand(ls, prune, logsExportKeyCmd(e))
	return cmd
}
