package service

import (
	"context"
	"path/filepath"

	"github.com/smx-dev/smx/internal/sshgw"
)

// SSHCA is the smx SSH user CA, whose short-lived certificates the SSH
// gateway logs in to target hosts with, and the lines a target host
// installs to trust it. Its private key never leaves the state directory.
type SSHCA struct {
	PublicKey   string `json:"public_key"` // an authorized_keys line, with the comment smx-user-ca
	Fingerprint string `json:"fingerprint"`
	// TrustedUserCAKeys is the sshd_config line (the key written to
	// /etc/ssh/smx_user_ca.pub); AuthorizedKeys the line for one account's
	// ~/.ssh/authorized_keys (USER is the account's name).
	TrustedUserCAKeys string `json:"trusted_user_ca_keys"`
	AuthorizedKeys    string `json:"authorized_keys"`
	// Replaced, after a rotation, is the fingerprint of the key it
	// replaced, which targets may stop trusting once they trust this one.
	Replaced string `json:"replaced,omitempty"`
}

const sshCAComment = "smx-user-ca"

func (s *Service) userCAPath() string { return filepath.Join(s.state.Root, sshgw.UserCAFile) }

func sshCAOf(ca *sshgw.CA) *SSHCA {
	key := ca.AuthorizedKey() + " " + sshCAComment
	return &SSHCA{PublicKey: key, Fingerprint: ca.Fingerprint(),
		TrustedUserCAKeys: "TrustedUserCAKeys /etc/ssh/smx_user_ca.pub",
		AuthorizedKeys:    `cert-authority,principals="USER" ` + key}
}

// SSHUserCA returns the SSH user CA, creating it on first use.
func (s *Service) SSHUserCA(ctx context.Context) (*SSHCA, error) {
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	ca, err := sshgw.LoadOrCreateCA(s.userCAPath(), sshCAComment)
	if err != nil {
		return nil, err
	}
	return sshCAOf(ca), nil
}

// RotateSSHUserCA replaces the CA's key; new SSH connections use the new
// one at once, so targets must trust it.
func (s *Service) RotateSSHUserCA(ctx context.Context) (*SSHCA, error) {
	if err := s.state.Ensure(); err != nil {
		return nil, err
	}
	old, _ := sshgw.LoadCA(s.userCAPath())
	ca, err := sshgw.RotateCA(s.userCAPath(), sshCAComment)
	if err != nil {
		return nil, err
	}
	out := sshCAOf(ca)
	if old != nil {
		out.Replaced = old.Fingerprint()
	}
	return out, nil
}
