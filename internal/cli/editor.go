package cli

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/smx-dev/smx/internal/errdefs"
)

// selfPath is how ssh's ProxyCommand runs this smx: the name it was
// started by, made absolute (a link named smx stays a link).
func selfPath() string {
	p, err := exec.LookPath(os.Args[0])
	if err == nil {
		if abs, err := filepath.Abs(p); err == nil {
			return abs
		}
	}
	if exe, err := os.Executable(); err == nil {
		return exe
	}
	return "smx"
}

func agentSSHConfigCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ssh-config NAME",
		Short: "Print the ssh_config Host block that reaches a sandbox through smx (no port opened)",
		Long: "Prints a Host block for ssh, scp, VS Code Remote-SSH and JetBrains Gateway: its\n" +
			"ProxyCommand is `smx agent ssh-proxy NAME`, which carries the SSH connection over\n" +
			"the sandbox's supervisor socket to an SSH server inside the supervisor; commands run\n" +
			"in the guest through the control channel, forwards reach only the guest's loopback.\n" +
			"The first call makes the sandbox's key pair and host key (in smx's state, 0600); the\n" +
			"host key is pinned in the known_hosts file the block names.",
		Example: "  ssh -F <(smx agent ssh-config web) web uname -a\n" +
			"  smx agent ssh-config web >> ~/.ssh/config   # then `ssh web`, or pick web in VS Code",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.svc().SSH(args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(e.stdout, c)
			}
			fmt.Fprint(e.stdout, c.Config(selfPath()))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func agentSSHProxyCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "ssh-proxy NAME",
		Short: "Carry one SSH connection to a sandbox on stdin and stdout (ssh's ProxyCommand)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.svc().SSHProxy(e.ctx, args[0], e.stdin, e.stdout)
		},
	}
}

func agentSSHCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ssh NAME [-- COMMAND...]",
		Short: "Open an SSH session to a sandbox with the system's ssh client",
		Example: "  smx agent ssh web\n" +
			"  smx agent ssh web -- uname -a",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := e.svc().SSH(args[0])
			if err != nil {
				return err
			}
			sshPath, err := exec.LookPath("ssh")
			if err != nil {
				return fmt.Errorf("no ssh client found: install OpenSSH's client (e.g. apt-get install openssh-client): %w", errdefs.ErrNotFound)
			}
			f, err := os.CreateTemp("", "smx-ssh-config-*")
			if err != nil {
				return err
			}
			defer os.Remove(f.Name())
			if _, err := f.WriteString(c.Config(selfPath())); err != nil {
				f.Close()
				return err
			}
			f.Close()
			sargs := append([]string{"-F", f.Name(), c.Name}, args[1:]...)
			p := exec.CommandContext(e.ctx, sshPath, sargs...)
			p.Stdin, p.Stdout, p.Stderr = e.stdin, e.stdout, e.stderr
			if err := p.Run(); err != nil {
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					return &ExitError{Code: ee.ExitCode()}
				}
				return err
			}
			return nil
		},
	}
	cmd.Flags().SetInterspersed(false)
	return cmd
}
