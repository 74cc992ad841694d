package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	wire "github.com/smx-dev/smx/api"
)

// newSSHCACmd is `smx ssh-ca`: the smx SSH user CA, whose short-lived
// certificates the SSH gateway logs in to target hosts with.
func newSSHCACmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "ssh-ca", Short: "Show or rotate the SSH user CA that target hosts trust for sandbox logins"}
	var keyOnly, asJSON bool
	show := &cobra.Command{
		Use:   "show",
		Short: "Print the CA public key and the lines to install on target hosts (creates the CA on first use)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ca, err := e.wire().SSHUserCA(e.ctx)
			if err != nil {
				return err
			}
			return printSSHCA(e.stdout, ca, keyOnly, asJSON)
		},
	}
	show.Flags().BoolVar(&keyOnly, "key", false, "print only the public key line")
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	rotate := &cobra.Command{
		Use:   "rotate",
		Short: "Replace the CA key; targets must then trust the new key (new connections use it at once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ca, err := e.wire().RotateSSHUserCA(e.ctx)
			if err != nil {
				return err
			}
			if ca.Replaced != "" && !asJSON {
				fmt.Fprintf(e.stdout, "# replaced %s; remove it from targets once they trust the new key\n", ca.Replaced)
			}
			return printSSHCA(e.stdout, ca, false, asJSON)
		},
	}
	rotate.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(show, rotate)
	return cmd
}

func printSSHCA(w io.Writer, ca *wire.SSHCA, keyOnly, asJSON bool) error {
	if keyOnly {
		_, err := fmt.Fprintln(w, ca.PublicKey)
		return err
	}
	if asJSON {
		return writeJSON(w, ca)
	}
	_, err := fmt.Fprintf(w, `# smx SSH user CA %s
%s

# To let sandboxes log in to a host (certificates live ssh.cert_ttl and name one user):
#   echo '%s' | sudo tee /etc/ssh/smx_user_ca.pub
#   and in /etc/ssh/sshd_config:
%s
# or for one account only, a line in ~USER/.ssh/authorized_keys:
%s
`, ca.Fingerprint, ca.PublicKey, ca.PublicKey, ca.TrustedUserCAKeys, ca.AuthorizedKeys)
	return err
}
