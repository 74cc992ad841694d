package supervisor

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/snapshot"
	"github.com/smx-dev/smx/internal/supproto"
)

// A running sandbox without the virtio-fs device (on QEMU 7.2 its mounts
// ride 9P) refuses to add or remove a mount in one line that names the
// QEMU it needs and what to do instead, before it touches anything.
func TestLiveMountsNeedVirtioFS(t *testing.T) {
	for _, tc := range []struct{ qemu, want string }{
		{"QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)", "needs QEMU 8.2 or newer"},
		{"QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-1~bpo12+1)", "has no virtio-fs device"},
	} {
		for _, req := range []*supproto.Request{
			{Op: supproto.OpMountAdd, Volume: t.TempDir() + ":/data"},
			{Op: supproto.OpMountRemove, Path: "/data"},
		} {
			s := &Supervisor{spec: sandbox.Spec{Name: "box"}, state: sandbox.State{Status: sandbox.StatusRunning},
				host: snapshot.Host{QEMUVersion: tc.qemu}}
			cli, srv := net.Pipe()
			done := make(chan struct{})
			go func() { defer close(done); s.handle(srv) }()
			if err := supproto.WriteRequest(cli, req); err != nil {
				t.Fatal(err)
			}
			_, err := supproto.ReadResult(cli)
			cli.Close()
			<-done
			if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s on %s: %v, want one line with %q", req.Op, tc.qemu, err, tc.want)
			}
		}
	}
}
