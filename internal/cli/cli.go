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

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/service"
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
	state  service.StateDir
	log    *slog.Logger
	cold   bool // --cold: boot, never restore a boot template

	service *service.Service // see svc
}

// svc is the service layer every lifecycle command goes through; its
// warnings (an operation that happened but could not be logged) go to
// stderr.
func (e *env) svc() *service.Service {
	if e.service == nil {
		e.service = service.New(e.state, e.log)
		e.service.Warn = func(msg string) { fmt.Fprintf(e.stderr, "smx: warning: %s\n", msg) }
	}
	return e.service
}

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
			d, err := service.DefaultStateDir()
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
		newSnapshotCmd(e), newDoctorCmd(e), newSetupCmd(e), newSuperviseCmd(e), agentWaitCmd(e))
	root.AddCommand(newSSHCACmd(e), newCacheCmd(e))
	root.AddCommand(newApprovalsCmd(e), newApproveCmd(e), newDenyCmd(e))
	root.AddCommand(newServeCmd(e), newUICmd(e), newEventsCmd(e), newMCPCmd(e))
	rejectUnknownSubcommands(root)
	setPlaceholders(root)
	root.SetFlagErrorFunc(flagError)
	return root
}

// writeJSONOr writes v, or returns err.
func writeJSONOr(w io.Writer, v any, err error) error {
	if err != nil {
		return err
	}
	return writeJSON(w, v)
}

// nonNilSlice makes a nil list an empty one, which JSON prints as [].
func nonNilSlice[T any](l []T) []T {
	if l == nil {
		return []T{}
	}
	return l
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseSize, parseEnv and humanBytes are the service's, under the names
// the commands use.
func parseSize(s string) (int64, error)        { return service.ParseSize(s) }
func parseEnv(vals []string) ([]string, error) { return service.ParseEnv(vals) }
func humanBytes(n int64) string                { return service.HumanBytes(n) }
