package guest

import (
	"fmt"
	"io"
	"os"

	"github.com/pkg/sftp"
)

// serveSFTP is smx-agent started as agentproto.SFTPServerArgs: an SFTP server on stdin
// and stdout with the rights of the user it runs as.
func serveSFTP() int {
	rw := struct {
		io.Reader
		io.WriteCloser
	}{os.Stdin, os.Stdout}
	s, err := sftp.NewServer(rw)
	if err != nil {
		fmt.Fprintln(os.Stderr, "smx-agent sftp-server:", err)
		return 1
	}
	if err := s.Serve(); err != nil && err != io.EOF {
		fmt.Fprintln(os.Stderr, "smx-agent sftp-server:", err)
		return 1
	}
	return 0
}
