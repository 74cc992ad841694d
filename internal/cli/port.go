package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/service"
)

// registerPublish adds -p and --publish-external to a command that
// creates a sandbox.
func registerPublish(cmd *cobra.Command, ports *[]string, external *bool) {
	cmd.Flags().StringArrayVarP(ports, "publish", "p", nil,
		"publish a guest TCP port on the host, [HOSTIP:]HOSTPORT:GUESTPORT[/tcp] as docker's -p (repeatable); HOSTIP defaults to 127.0.0.1, HOSTPORT 0 picks a free port")
	cmd.Flags().BoolVar(external, "publish-external", false,
		"allow -p to name a HOSTIP that is not loopback (e.g. 0.0.0.0): the port is then reachable from other machines")
}

// portLine says where a published port is served; one reachable beyond
// this host says so.
func portLine(b service.PortBinding, running bool) string {
	if !running {
		return fmt.Sprintf("%d/tcp -> %s (bound at the next start)", b.GuestPort, b.Host(b.HostPort))
	}
	line := b.String()
	if b.External {
		line += " (reachable from other machines: published with --publish-external)"
	}
	return line
}

// printPorts prints sandbox name's published ports, each line after
// prefix. A failure to list them is a warning: the sandbox is up.
func (e *env) printPorts(w io.Writer, name, prefix string) {
	l, err := e.svc().Ports(e.ctx, name)
	if err != nil {
		fmt.Fprintf(e.stderr, "smx: warning: listing the published ports of %s: %s\n", name, userMessage(err.Error()))
		return
	}
	for _, b := range l.Ports {
		fmt.Fprintf(w, "%spublished %s\n", prefix, portLine(b, l.Running))
	}
}

func agentPortCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "port",
		Short: "Publish, withdraw and list a sandbox's ports on the host",
		Long: "A published port is served by the sandbox's supervisor: it listens on the host port\n" +
			"and carries each connection to the guest's port through the sandbox's own network\n" +
			"gateway (the guest is never put on the host's network); each connection is a\n" +
			"port.accept record in the sandbox's log. On a running sandbox a change applies at\n" +
			"once; on one that does not run, from its next start.",
	}
	cmd.AddCommand(agentPortAddCmd(e), agentPortRmCmd(e), agentPortLsCmd(e))
	return cmd
}

func agentPortAddCmd(e *env) *cobra.Command {
	var external bool
	cmd := &cobra.Command{
		Use:   "add NAME [HOSTIP:]HOSTPORT:GUESTPORT[/tcp]...",
		Short: "Publish guest ports on the host (127.0.0.1 unless HOSTIP and --publish-external say otherwise)",
		Example: "  smx agent port add web 8080:8000\n" +
			"  smx agent port add web 0:3000            # a free host port; `smx agent port ls web` says which\n" +
			"  smx agent port add web 0.0.0.0:8080:8000 --publish-external",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var l *service.PortList
			for _, p := range args[1:] {
				var err error
				if l, err = e.svc().AddPort(e.ctx, service.PortRequest{Name: args[0], Port: p, PublishExternal: external}); err != nil {
					return err
				}
			}
			for _, b := range l.Ports {
				fmt.Fprintf(e.stdout, "%s\n", portLine(b, l.Running))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&external, "publish-external", false,
		"allow a HOSTIP that is not loopback (e.g. 0.0.0.0): the port is then reachable from other machines")
	return cmd
}

func agentPortRmCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "rm NAME [HOSTIP:]HOSTPORT[:GUESTPORT]...",
		Short:   "Withdraw published ports; connections through them are closed",
		Example: "  smx agent port rm web 8080",
		Args:    cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, p := range args[1:] {
				if _, err := e.svc().RemovePort(e.ctx, service.PortRequest{Name: args[0], Port: p}); err != nil {
					return err
				}
			}
			return nil
		},
	}
	return cmd
}

func agentPortLsCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls NAME",
		Short: "List a sandbox's published ports (GUESTPORT/tcp -> HOSTIP:HOSTPORT, as docker port)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := e.svc().Ports(e.ctx, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				wl, err := api.WirePorts(l, nil)
				if err != nil {
					return err
				}
				return writeJSON(e.stdout, wl)
			}
			for _, b := range l.Ports {
				fmt.Fprintln(e.stdout, portLine(b, l.Running))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
