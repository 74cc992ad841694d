package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/smx-dev/smx/internal/agentproto"
	"github.com/smx-dev/smx/internal/errdefs"
)

// dialLoopback serves agentproto.OpDial: it connects to 127.0.0.1:port
// inside the guest and splices the stream with that connection. Only
// loopback is dialled: the guest reaches other addresses through its own
// network, where the host's egress policy applies.
func dialLoopback(ctx context.Context, w io.Writer, stream io.ReadWriteCloser, port uint16) error {
	if port == 0 {
		return fmt.Errorf("guest: dial: no port: %w", errdefs.ErrInvalid)
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("guest: dial 127.0.0.1:%d: %v: %w", port, errors.Unwrap(err), errdefs.ErrUnavailable)
	}
	defer c.Close()
	if err := agentproto.WriteJSON(w, agentproto.FrameResult, agentproto.Result{OK: true}); err != nil {
		return nil
	}
	done := make(chan struct{})
	go func() {
		io.Copy(c, stream)
		c.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	io.Copy(stream, c)
	stream.Close()
	<-done
	return nil
}
