package guest

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/smx-dev/smx/internal/agentproto"
)

// SSHKnownHosts is the system-wide known_hosts file OpenSSH reads
// (GlobalKnownHostsFile). The sandbox's SSH host CA goes there as an
// @cert-authority line, so the guest's ssh trusts the host certificates of
// the SSH gateway (internal/sshgw) for every host; only the public key
// comes here.
const SSHKnownHosts = "/etc/ssh/ssh_known_hosts"

const (
	sshCABegin = "# smx sandbox SSH CA (replaced at every boot and restore)\n"
	sshCAEnd   = "# end smx sandbox SSH CA\n"
)

var sshCALineRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^@cert-authority \* ([a-z0-9@.-]{1,64}) ([A-Za-z0-9+/=]{16,})( [A-Za-z0-9._@:-]{0,128})?$`)
})

func installSSHCA(w io.Writer, line string) error {
	if err := InstallSSHCA("/", line); err != nil {
		return err
	}
	return agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true})
}

// InstallSSHCA writes line ("@cert-authority * KEYTYPE BASE64 [COMMENT]")
// into the known_hosts file under root between marker lines, replacing the
// block an earlier install left: a restored fork has its own SSH host CA
// and must stop trusting its source's.
func InstallSSHCA(root, line string) error {
	var m []string
	if len(line) <= 8192 {
		m = sshCALineRE().FindStringSubmatch(line)
	}
	if m == nil {
		return errors.New("guest: install-ssh-ca: want one line \"@cert-authority * KEYTYPE KEY [COMMENT]\"")
	}
	if _, err := base64.StdEncoding.DecodeString(m[2]); err != nil {
		return errors.New("guest: install-ssh-ca: key is not base64")
	}
	p := filepath.Join(root, SSHKnownHosts)
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	old, err := os.ReadFile(p)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("guest: install-ssh-ca: %w", err)
	}
	block := []byte(strings.TrimSpace(line) + "\n")
	return writeAtomic(p, replaceBlock(old, block, sshCABegin, sshCAEnd))
}

// replaceBlock drops every block between begin and end from file and
// appends one holding body: smx's CA in the trust bundles and its SSH host
// CA in ssh_known_hosts are each one such block, replaced on every install.
func replaceBlock(file, body []byte, begin, end string) []byte {
	var out []byte
	for {
		i := bytes.Index(file, []byte(begin))
		if i < 0 {
			break
		}
		out = append(out, file[:i]...)
		j := bytes.Index(file[i:], []byte(end))
		if j < 0 {
			file = nil
			break
		}
		file = file[i+j+len(end):]
	}
	out = append(out, file...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	out = append(out, begin...)
	out = append(out, body...)
	return append(out, end...)
}
