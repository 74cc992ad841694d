package supervisor

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/creds"
	"github.com/smx-dev/smx/internal/netstack"
	"github.com/smx-dev/smx/internal/policy"
	"github.com/smx-dev/smx/internal/sshgw"
)

// sshParts is the sandbox's SSH gateway and the host CA its guest trusts.
type sshParts struct {
	gw     *sshgw.Gateway
	hostCA *sshgw.CA
}

// netPolicy is the network gateway's policy: the profile's network
// section, with the hosts its ssh section names routed to the SSH gateway.
func netPolicy(prof *policy.Profile) netstack.PolicyFunc {
	return netstack.WithSSH(netstack.ProfilePolicy(prof), prof)
}

// startSSH starts the SSH gateway on the network stack. The sandbox's SSH
// host CA lives in its directory (a fork gets its own); the smx user CA
// under the state directory is created on first use.
func (s *Supervisor) startSSH(st *netstack.Stack, prof *policy.Profile) error {
	hostCA, err := sshgw.LoadOrCreateCA(filepath.Join(s.paths.Dir, sshgw.HostCAFile), "smx-sandbox-"+s.spec.Name)
	if err != nil {
		return fmt.Errorf("supervisor: ssh: %w", err)
	}
	userCA := filepath.Join(s.opts.State.Root, sshgw.UserCAFile)
	if _, err := sshgw.LoadOrCreateCA(userCA, "smx-user-ca"); err != nil {
		return fmt.Errorf("supervisor: ssh: %w", err)
	}
	store := creds.Store{Dir: s.opts.State.Creds()}
	gw, err := sshgw.New(sshgw.Config{
		Sandbox:    s.spec.Name,
		GitAsk:     s.askGit,
		Ask:        s.askSSH,
		HostCA:     hostCA,
		UserCAPath: userCA,
		Secret:     store.Get,
		// The ssh-agent of the shell that started the sandbox, for
		// credentials that opt in to it (from: "@ssh-agent").
		AgentSocket: os.Getenv("SSH_AUTH_SOCK"),
		Log:         s.audit,
		Logger:      s.log,
		GitMirrors:  s.git.Mirrors(),
	}, prof)
	if err != nil {
		return fmt.Errorf("supervisor: ssh: %w", err)
	}
	s.ssh = sshParts{gw: gw, hostCA: hostCA}
	st.SetSSH(func(ctx context.Context, guest net.Conn, f netstack.Flow, refusal *policy.Decision) {
		gw.Serve(ctx, guest, sshgw.Target{Host: f.Host, Addr: f.Dst, Refusal: refusal})
	}, func(f netstack.Flow) bool { return gw.Explains(f.Host, f.Dst.Port()) })
	s.defer_(gw.Close)
	return nil
}

// sshGuestRequests are sent at every boot and restore: the guest trusts
// this sandbox's SSH host CA, and no longer its source's.
func (s *Supervisor) sshGuestRequests() []*agentproto.Request {
	if s.ssh.hostCA == nil {
		return nil
	}
	return []*agentproto.Request{{Op: agentproto.OpInstallSSHCA,
		SSHKnownHosts: s.ssh.hostCA.KnownHostsLine("smx-sandbox-" + s.spec.Name)}}
}

func (s *Supervisor) setSSHProfile(prof *policy.Profile) {
	if s.ssh.gw != nil {
		s.ssh.gw.SetProfile(prof)
	}
}
