package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/service"
)

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
				k, err := e.svc().LogKey(e.ctx)
				if err != nil {
					return err
				}
				fmt.Fprintln(e.stdout, k)
				return nil
			}
			name := args[0]
			if verify {
				return e.verifyLog(name, keyFile, asJSON)
			}
			var f service.LogFilter
			f.Refusals = refusals
			if since != "" {
				t, err := parseSince(since)
				if err != nil {
					return err
				}
				f.Since = t
			}
			print := func(r service.LogRecord) error {
				if asJSON {
					b, err := json.Marshal(api.WireRecord(r))
					if err != nil {
						return err
					}
					_, err = fmt.Fprintf(e.stdout, "%s\n", b)
					return err
				}
				_, err := fmt.Fprintln(e.stdout, formatRecord(r))
				return err
			}
			ctx := e.ctx
			if follow {
				var stop context.CancelFunc
				ctx, stop = signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
				defer stop()
			}
			return e.svc().Logs(ctx, service.LogsRequest{Name: name, Filter: f, Follow: follow}, print)
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

func (e *env) verifyLog(name, keyFile string, asJSON bool) error {
	req := service.VerifyRequest{Name: name}
	if keyFile != "" {
		b, err := os.ReadFile(keyFile)
		if err != nil {
			return err
		}
		req.PublicKey = string(b)
	}
	res, err := e.svc().VerifyLog(e.ctx, req)
	if err != nil {
		return err
	}
	if res.Warning != "" {
		fmt.Fprintf(e.stderr, "smx: warning: %s\n", res.Warning)
	}
	rep := res.Report
	if asJSON {
		if err := writeJSON(e.stdout, api.WireVerifyReport(name, res)); err != nil {
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
			key, file, added, err := e.svc().ExportLogKey(e.ctx)
			if err != nil {
				return err
			}
			fmt.Fprintln(e.stdout, key)
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
func formatRecord(r service.LogRecord) string {
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
var generatedName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^smx-[0-9a-f]{8}$`) })

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
			names, err := e.svc().ListLogs(e.ctx)
			if err != nil {
				return err
			}
			unnamed := 0
			for _, n := range names {
				if !lsAll && generatedName().MatchString(n) {
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
			done, err := e.svc().PruneLogs(e.ctx, args, all)
			for _, n := range done {
				fmt.Fprintln(e.stdout, n)
			}
			return err
		},
	}
	prune.Flags().BoolVar(&all, "all", false, "prune the logs of every removed sandbox")
	cmd.AddCommand(ls, prune, logsExportKeyCmd(e), logsExportCmd(e), logsVerifyCmd(e))
	return cmd
}
