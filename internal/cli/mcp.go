package cli

import (
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/mcpserver"
)

func newMCPCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve sandboxes as MCP tools on stdio (for Claude Code and other MCP hosts)",
		Long: "Speak the Model Context Protocol (JSON-RPC 2.0) on stdin/stdout, offering the\n" +
			"tools sandbox_create, sandbox_exec, sandbox_cp, sandbox_snapshot, sandbox_fork,\n" +
			"sandbox_logs, sandbox_rm and sandbox_ls. Add it to an MCP host as the command\n" +
			"`smx mcp`; it needs no `smx serve`. When stdin ends, every request read before\n" +
			"its end is answered before smx exits (so a piped script gets all its answers).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.state.Ensure(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(e.ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			return mcpserver.New(api.ServiceBackend{S: e.svc()}, Version, func(err error) string { return userMessage(err.Error()) }).Run(ctx, mcpserver.AnswerAll(&mcp.IOTransport{Reader: readCloser{e.stdin}, Writer: writeCloser{e.stdout}}))
		},
	}
}

type readCloser struct{ io.Reader }

func (readCloser) Close() error { return nil }

type writeCloser struct{ io.Writer }

func (writeCloser) Close() error { return nil }
