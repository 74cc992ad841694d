package service

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/sshserve"
	"github.com/smx-dev/smx/internal/supproto"
)

// SSHConfig is what an ssh client needs to reach a sandbox through
// `smx agent ssh-proxy` (internal/sshserve).
type SSHConfig struct {
	Name       string `json:"name"`
	Alias      string `json:"alias"` // the host key's name in KnownHosts
	User       string `json:"user"`
	KeyFile    string `json:"identity_file"`
	KnownHosts string `json:"known_hosts"`
}

// SSH returns sandbox name's SSH settings, making its key pairs (in the
// sandbox's directory, 0600) and known_hosts on first use.
func (s *Service) SSH(name string) (*SSHConfig, error) {
	if _, err := s.manager().Get(name); err != nil {
		return nil, err
	}
	f := sshserve.Files{Dir: s.manager().Paths(name).Dir}
	keys, err := f.Ensure()
	if err != nil {
		return nil, fmt.Errorf("making the SSH keys of %s: %w", name, err)
	}
	c := &SSHConfig{Name: name, Alias: "smx-" + name, User: "root", KeyFile: f.ClientKey(), KnownHosts: f.KnownHosts()}
	if err := f.WriteKnownHosts(c.Alias, keys); err != nil {
		return nil, err
	}
	if rec, err := s.AgentRecord(name); err == nil && rec != nil && rec.User != "" {
		c.User = rec.User
	}
	return c, nil
}

// Config is the ssh_config Host block for c; ssh-proxy runs exe.
func (c *SSHConfig) Config(exe string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Host %s\n", c.Name)
	fmt.Fprintf(&b, "  HostName %s\n", c.Alias) // a placeholder: ProxyCommand carries the connection
	fmt.Fprintf(&b, "  User %s\n", c.User)
	fmt.Fprintf(&b, "  IdentityFile %s\n", c.KeyFile)
	b.WriteString("  IdentitiesOnly yes\n")
	fmt.Fprintf(&b, "  ProxyCommand %s agent ssh-proxy %s\n", exe, c.Name)
	fmt.Fprintf(&b, "  HostKeyAlias %s\n", c.Alias)
	fmt.Fprintf(&b, "  UserKnownHostsFile %s\n", c.KnownHosts)
	b.WriteString("  StrictHostKeyChecking yes\n")
	b.WriteString("  ForwardAgent no\n")
	return b.String()
}

// SSHProxy carries one SSH connection between rw (the ssh client's
// ProxyCommand pipe) and the supervisor of sandbox name, until either
// side ends.
func (s *Service) SSHProxy(ctx context.Context, name string, in io.Reader, out io.Writer) error {
	if _, _, err := s.check(name, sandbox.OpExec); err != nil {
		return err
	}
	f := sshserve.Files{Dir: s.manager().Paths(name).Dir}
	if _, err := f.Load(); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sandbox %s has no SSH keys yet: run `smx agent ssh-config %s` first: %w", name, name, errdefs.ErrFailed)
	}
	conn, err := sandbox.DialSocket(ctx, s.manager().Paths(name).Socket())
	if err != nil {
		return fmt.Errorf("sandbox %s is not running (start it with `smx agent start %s`): %w", name, name, errdefs.ErrFailed)
	}
	defer conn.Close()
	if err := supproto.WriteRequest(conn, &supproto.Request{Op: supproto.OpSSH}); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		io.Copy(conn, in)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		close(done)
	}()
	// A refusal before the SSH stream is one error frame; SSH itself
	// starts with "SSH-", never a frame type byte.
	var first [1]byte
	if _, err := io.ReadFull(conn, first[:]); err != nil {
		return fmt.Errorf("sandbox %s: the supervisor closed the SSH connection: %w", name, errdefs.ErrFailed)
	}
	if first[0] == byte(agentproto.FrameError) {
		_, err := supproto.ReadResult(io.MultiReader(strings.NewReader(string(first[:])), conn))
		return err
	}
	if _, err := out.Write(first[:]); err != nil {
		return err
	}
	io.Copy(out, conn)
	return nil
}
