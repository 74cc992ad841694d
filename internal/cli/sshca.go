package cli

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sshgw"
)

// newSSHCACmd is `smx ssh-ca`: the smx SSH user CA, whose short-lived
// certificates the SSH gateway logs in to target hosts with.
func newSSHCACmd(e *env) *cobra.Command {
	cmd := &cobra.Command{Use: "ssh-ca", Short: "Show or rotate the SSH user CA that target hosts trust for sandbox logins"}
	userCA := func() string { return filepath.Join(e.state.Root, sshgw.UserCAFile) }
	var keyOnly, asJSON bool
	show := &cobra.Command{
		Use:   "show",
		Short: "Print the CA public key and the lines to install on target hosts (creates the CA on first use)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := e.state.Ensure(); err != nil {
				return err
			}
			ca, err := sshgw.LoadOrCreateCA(userCA(), "smx-user-ca")
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
			if err := e.state.Ensure(); err != nil {
				return err
			}
			old, _ := sshgw.LoadCA(userCA())
			ca, err := sshgw.RotateCA(userCA(), "smx-user-ca")
			if err != nil {
				return err
			}
			if old != nil && !asJSON {
				fmt.Fprintf(e.stdout, "# replaced %s; remove it from targets once they trust the new key\n", old.Fingerprint())
			}
			return printSSHCA(e.stdout, ca, false, asJSON)
		},
	}
	rotate.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(show, rotate)
	return cmd
}

func printSSHCA(w io.Writer, ca *sshgw.CA, keyOnly, asJSON bool) error {
	key := ca.AuthorizedKey() + " smx-user-ca"
	if keyOnly {
		_, err := fmt.Fprintln(w, key)
		return err
	}
	if asJSON {
		return writeJSON(w, map[string]string{"public_key": key, "fingerprint": ca.Fingerprint(),
			"trusted_user_ca_keys": "TrustedUserCAKeys /etc/ssh/smx_user_ca.pub",
			"authorized_keys":      `cert-authority,principals="USER" ` + key})
	}
	_, err := fmt.Fprintf(w, `# smx SSH user CA %s
%s

# To let sandboxes log in to a host (certificates live ssh.cert_ttl and name one user):
#   echo '%s' | sudo tee /etc/ssh/smx_user_ca.pub
#   and in /etc/ssh/sshd_config:
TrustedUserCAKeys /etc/ssh/smx_user_ca.pub
# or for one account only, a line in ~USER/.ssh/authorized_keys:
cert-authority,principals="USER" %s
`, ca.Fingerprint(), key, key, key)
	return err
}

// explainSSH adds to `smx profile explain` what an allowed SSH connection
// may do and how the gateway logs in.
func explainSSH(w io.Writer, p *policy.Profile, req policy.Request) {
	d, rule := p.DecideSSH(req)
	if !d.Allow {
		return
	}
	sftp := "denied"
	if rule.SFTP == policy.Allow {
		sftp = "allowed"
	}
	fwd := "none"
	if len(rule.Forward) > 0 {
		fwd = strings.Join(rule.Forward, ", ")
	}
	env := policy.DefaultSSHEnv
	if rule.Env != nil {
		env = rule.Env
	}
	login := "certificate from the smx SSH user CA, valid " + p.SSH.CertTTL.String() + ", principal " + req.User
	if c, ok := p.CredentialFor(req); ok {
		login = "host-held key: credential " + c.Name + " (secret " + c.From + ")"
	}
	hostKey := "host user's known_hosts"
	if rule.HostKey != "" {
		hostKey = "pinned " + rule.HostKey
	}
	fmt.Fprintf(w, "login  %s\nverify %s\nsftp   %s (scp too)\nfwd    %s\nenv    %s\n", login, hostKey, sftp, fwd, strings.Join(env, " "))
}
