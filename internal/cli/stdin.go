package cli

import (
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// stdinUntil returns r as a reader whose Read ends (with io.EOF) once
// done is closed, even when it is blocked: an exec's stdin copier then
// ends with the exec, instead of waiting for the next keystroke or line
// (for ever, in a program that runs execs one after another). Only an
// *os.File can be interrupted; other readers are returned as they are
// (a pipe or connection is closed by its owner).
func stdinUntil(r io.Reader, done <-chan struct{}) io.Reader {
	f, ok := r.(*os.File)
	if !ok {
		return r
	}
	var p [2]int
	if unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK) != nil {
		return r
	}
	cr := &cancelReader{f: f, wake: p}
	go func() {
		<-done
		cr.mu.Lock()
		defer cr.mu.Unlock()
		cr.closed = true
		if cr.active {
			unix.Write(cr.wake[1], []byte{0}) // the reader closes the pipe
			return
		}
		cr.closePipe()
	}()
	return cr
}

type cancelReader struct {
	f      *os.File
	wake   [2]int // self-pipe: readable once done
	mu     sync.Mutex
	closed bool // done was closed
	active bool // a Read is polling
	shut   bool // the pipe is closed
}

func (c *cancelReader) closePipe() {
	if !c.shut {
		unix.Close(c.wake[0])
		unix.Close(c.wake[1])
		c.shut = true
	}
}

func (c *cancelReader) Read(b []byte) (int, error) {
	c.mu.Lock()
	if c.closed {
		c.closePipe()
		c.mu.Unlock()
		return 0, io.EOF
	}
	c.active = true
	c.mu.Unlock()
	fds := []unix.PollFd{{Fd: int32(c.f.Fd()), Events: unix.POLLIN}, {Fd: int32(c.wake[0]), Events: unix.POLLIN}}
	var err error
	for {
		_, err = unix.Poll(fds, -1)
		if err != unix.EINTR {
			break
		}
	}
	c.mu.Lock()
	c.active = false
	if c.closed {
		c.closePipe()
		c.mu.Unlock()
		return 0, io.EOF
	}
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return c.f.Read(b)
}
