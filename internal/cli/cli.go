// Package cli implements the smx command line. It is a library so that
// tests and main share one entry point: Main(ctx, args, stdio).
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"smx/internal/errdefs"
	"smx/internal/image"
	"smx/internal/sandbox"
	"smx/internal/statedir"
)

// ExitError carries a process exit code out of a command (e.g. the exit
// status of the guest command for `smx run`).
type ExitError struct {
	Code int
	Err  error // printed to stderr when set
}

func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// exitSmxError is what smx exits with when it failed itself (as opposed to
// the guest command failing), like `docker run`.
const exitSmxError = 125

// env is what every command needs.
type env struct {
	ctx    context.Context
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	state  statedir.Dir
	log    *slog.Logger
	cold   bool // --cold: boot, never restore a boot template
}

func (e *env) manager() *sandbox.Manager { return &sandbox.Manager{State: e.state} }
func (e *env) images() *image.Store      { return &image.Store{Dir: e.state.Images()} }

// Main runs smx with args (without the program name) and returns the exit
// code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{ctx: ctx, stdin: stdin, stdout: stdout, stderr: stderr,
		log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	root := newRoot(e)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintf(stderr, "smx: %v\n", ee.Err)
		}
		return ee.Code
	}
	// One line a user can act on; the whole chain under --debug.
	if debug, _ := root.PersistentFlags().GetBool("debug"); debug {
		fmt.Fprintf(stderr, "smx: %v\n", err)
	} else {
		fmt.Fprintf(stderr, "smx: %s\n", userMessage(err.Error()))
	}
	// smx's own failures, bad input included, exit 125 as docker's do, so
	// they never look like the guest command's own exit status.
	return exitSmxError
}

func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:           "smx",
		Short:         "Run AI coding agents in microVMs behind a host-side permission gateway",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			d, err := statedir.Default()
			if err != nil {
				return err
			}
			e.state = d
			if v, _ := cmd.Flags().GetBool("debug"); v {
				e.log = slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
			}
			return nil
		},
	}
	root.PersistentFlags().Bool("debug", false, "log debugging detail to stderr")
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(newRunCmd(e), newAgentCmd(e), newImageCmd(e), newProfileCmd(e), newCredsCmd(e), newLogsCmd(e), newKernelCmd(e), newTemplateCmd(e),
		newSnapshotCmd(e), newDoctorCmd(e), newSetupCmd(e), newSuperviseCmd(e))
	root.AddCommand(newSSHCACmd(e))
	rejectUnknownSubcommands(root)
	setPlaceholders(root)
	root.SetFlagErrorFunc(flagError)
	return root
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

var sizeRE = regexp.MustCompile(`^([0-9]+)([KkMmGgTt]?)(i?[Bb])?$`)

// parseSize reads "512M", "1G", "4GiB", "1048576" as bytes.
func parseSize(s string) (int64, error) {
	m := sizeRE.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("invalid size %q: use a number with an optional K, M, G or T suffix, e.g. 512M or 2G: %w", s, errdefs.ErrInvalid)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %w", s, errdefs.ErrInvalid)
	}
	shift := map[string]uint{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[strings.ToLower(m[2])]
	if n > (1<<62)>>shift {
		return 0, fmt.Errorf("invalid size %q: too large: %w", s, errdefs.ErrInvalid)
	}
	return n << shift, nil
}

var envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// parseEnv checks -e values. "K=V" sets; a bare "K" takes K from the host
// environment, as docker does.
func parseEnv(vals []string) ([]string, error) {
	var out []string
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !envKeyRE.MatchString(k) {
			return nil, fmt.Errorf("invalid environment variable %q: want KEY=VALUE with KEY of letters, digits and _: %w", v, errdefs.ErrInvalid)
		}
		if !ok {
			hv, found := os.LookupEnv(k)
			if !found {
				continue
			}
			val = hv
		}
		out = append(out, k+"="+val)
	}
	return out, nil
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
