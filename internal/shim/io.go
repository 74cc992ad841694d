package shim

import (
	"context"
	"io"
	"sync"
	"syscall"
	"time"

	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/fifo"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/service"
)

// closableStdin is a stdin FIFO that CloseIO ends: the read it
// interrupts reports EOF, which is what tells the guest process its input
// ended (ctr keeps its end open and calls CloseIO instead).
type closableStdin struct {
	f      io.ReadCloser
	mu     sync.Mutex
	closed bool
}

func (c *closableStdin) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	if err != nil {
		c.mu.Lock()
		if c.closed {
			err = io.EOF
		}
		c.mu.Unlock()
	}
	return n, err
}

func (c *closableStdin) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.drain(2 * time.Second)
	return c.f.Close()
}

// drain waits until the reader has taken (TIOCINQ is FIONREAD on Linux) what the client wrote before its
// CloseIO (ctr writes all of stdin, then calls CloseIO at once: closing
// the FIFO then dropped what was still in the pipe), or until d passes.
func (c *closableStdin) drain(d time.Duration) {
	sc, ok := c.f.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		n := 0
		if err := rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil || n == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// openIO opens a process's stdio FIFOs for its exec; their other ends
// are held by containerd's client (ctr, CRI). The closers end them once
// the process is done.
func (s *Shim) openIO(ctx context.Context, p *proc) (service.ExecIO, []io.Closer, error) {
	sio := service.ExecIO{Signal: p.signals}
	var closers []io.Closer
	if p.stdin != "" {
		f, err := fifo.OpenFifo(context.WithoutCancel(ctx), p.stdin, unix.O_RDONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			return sio, nil, grpcErr(err)
		}
		in := &closableStdin{f: f}
		sio.Stdin = in
		s.mu.Lock()
		p.stdinF = in
		s.mu.Unlock()
		closers = append(closers, f)
	}
	for _, o := range []struct {
		path string
		w    *io.Writer
	}{{p.stdout, &sio.Stdout}, {p.stderr, &sio.Stderr}} {
		if o.path == "" {
			continue
		}
		// Read-write: opening does not wait for a reader, and a client
		// that detached (ctr run -d) leaves the process writing into the
		// pipe's buffer rather than blocking this call for good.
		f, err := fifo.OpenFifo(context.WithoutCancel(ctx), o.path, unix.O_RDWR, 0)
		if err != nil {
			for _, c := range closers {
				c.Close()
			}
			return sio, nil, grpcErr(err)
		}
		*o.w = f
		closers = append(closers, f)
	}
	return sio, closers, nil
}

// CloseIO closes a process's stdin.
func (s *Shim) CloseIO(ctx context.Context, r *taskapi.CloseIORequest) (*ptypes.Empty, error) {
	_, p, err := s.proc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	f := p.stdinF
	s.mu.Unlock()
	if f != nil && r.Stdin {
		f.Close()
	}
	return &ptypes.Empty{}, nil
}

// ResizePty resizes a process's terminal.
func (s *Shim) ResizePty(ctx context.Context, r *taskapi.ResizePtyRequest) (*ptypes.Empty, error) {
	_, p, err := s.proc(r.ID, r.ExecID)
	if err != nil {
		return nil, err
	}
	select {
	case p.resize <- service.WindowSize{Rows: uint16(r.Height), Cols: uint16(r.Width)}:
	case <-p.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &ptypes.Empty{}, nil
}
