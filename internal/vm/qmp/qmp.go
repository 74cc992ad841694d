// Package qmp is a small client for the QEMU Machine Protocol.
//
// It is hand-written rather than taken from go-qemu because that library
// reads replies with a bufio.Scanner and breaks on replies over 64 KiB
// (query-qmp-schema, large query-block results). Here a json.Decoder reads
// the stream, so a reply may be any size.
package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Event is an asynchronous QMP event such as SHUTDOWN or STOP.
type Event struct {
	Name      string          `json:"event"`
	Data      json.RawMessage `json:"data,omitempty"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// Time reports when QEMU emitted the event.
func (e Event) Time() time.Time {
	return time.Unix(e.Timestamp.Seconds, e.Timestamp.Microseconds*1000)
}

// Error is an error reply from QEMU. Class is QEMU's error class
// (GenericError, CommandNotFound, DeviceNotFound, ...).
type Error struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("qmp: %s: %s: %s", e.Command, e.Class, e.Desc)
}

// Is maps QEMU's classes onto smx's error classes so callers can use
// errors.Is without knowing QMP.
func (e *Error) Is(target error) bool {
	switch e.Class {
	case "CommandNotFound", "DeviceNotFound":
		return target == errdefs.ErrNotFound
	default:
		return target == errdefs.ErrFailed
	}
}

// message is any object QEMU sends: a greeting, a reply or an event.
type message struct {
	QMP    json.RawMessage `json:"QMP"`
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
	Event  string          `json:"event"`
	ID     *uint64         `json:"id"`
}

// Client is one QMP connection. Execute may be called from several
// goroutines; commands are serialised because QMP answers in order and a
// reply carries no more than the id we gave it.
type Client struct {
	conn   net.Conn
	mu     sync.Mutex // serialises Execute
	nextID uint64

	replies chan message
	events  chan Event
	done    chan struct{} // closed when the reader stops
	closing chan struct{} // closed by Close so the reader never blocks on replies
	readErr error         // set before done is closed

	closeOnce sync.Once
}

// eventBuffer is how many events wait for a slow reader before new ones are
// dropped; the reader goroutine must never block on events, or replies
// would stall behind them.
const eventBuffer = 64

// Dial connects to the QMP socket at path, reads the greeting and leaves
// capabilities negotiation mode. ctx bounds only the handshake.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("qmp: dial %s: %w: %w", path, errdefs.ErrUnavailable, err)
	}
	c := &Client{
		conn:    conn,
		replies: make(chan message, 1),
		events:  make(chan Event, eventBuffer),
		done:    make(chan struct{}),
		closing: make(chan struct{}),
	}
	dec := json.NewDecoder(conn)
	// The greeting is read here rather than by the reader goroutine so a
	// peer that is not QMP fails Dial instead of the first Execute.
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	var greet message
	err = dec.Decode(&greet)
	stop()
	conn.SetReadDeadline(time.Time{})
	if err == nil && greet.QMP == nil {
		err = errors.New("no QMP greeting")
	}
	if err != nil {
		conn.Close()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("qmp: handshake on %s: %w: %w", path, errdefs.ErrUnavailable, err)
	}
	go c.read(dec)
	if err := c.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Client) read(dec *json.Decoder) {
	defer close(c.events)
	defer close(c.done)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			c.readErr = err
			return
		}
		var m message
		if err := json.Unmarshal(raw, &m); err != nil {
			continue // not an object; QEMU never sends one, so ignore it
		}
		if m.Event != "" {
			var ev Event
			if json.Unmarshal(raw, &ev) != nil {
				continue
			}
			select {
			case c.events <- ev:
			default:
			}
			continue
		}
		select {
		case c.replies <- m:
		case <-c.closing:
			return
		}
	}
}

// Events returns asynchronous events. It is closed when the connection
// ends. Events are dropped when nobody reads them.
func (c *Client) Events() <-chan Event { return c.events }

// Done is closed when the connection has ended, for example after quit.
func (c *Client) Done() <-chan struct{} { return c.done }

// Execute runs cmd with args (marshalled to JSON; nil for none) and
// unmarshals the "return" value into reply unless reply is nil. An error
// reply is returned as *Error.
func (c *Client) Execute(ctx context.Context, cmd string, args any, reply any) error {
	return c.execute(ctx, cmd, args, nil, reply)
}

// ExecuteFD is Execute with f passed to QEMU alongside the command
// (SCM_RIGHTS), as the getfd and add-fd commands expect. QEMU keeps its
// own copy; the caller may close f once ExecuteFD returns.
func (c *Client) ExecuteFD(ctx context.Context, cmd string, args any, f *os.File, reply any) error {
	if f == nil {
		return fmt.Errorf("qmp: %s: no file to pass: %w", cmd, errdefs.ErrInvalid)
	}
	return c.execute(ctx, cmd, args, f, reply)
}

func (c *Client) execute(ctx context.Context, cmd string, args any, f *os.File, reply any) error {
	c.mu.Lock()
	defer c.mu.Unlock()

	c.nextID++
	id := c.nextID
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        uint64 `json:"id"`
	}{cmd, args, id}
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qmp: %s: %w: %w", cmd, errdefs.ErrInvalid, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.conn.SetWriteDeadline(dl)
		defer c.conn.SetWriteDeadline(time.Time{})
	}
	var werr error
	if f != nil {
		uc, ok := c.conn.(*net.UnixConn)
		if !ok {
			return fmt.Errorf("qmp: %s: passing a file needs a unix socket: %w", cmd, errdefs.ErrInvalid)
		}
		_, _, werr = uc.WriteMsgUnix(append(b, '\n'), unix.UnixRights(int(f.Fd())), nil)
	} else {
		_, werr = c.conn.Write(append(b, '\n'))
	}
	if err := werr; err != nil {
		return fmt.Errorf("qmp: %s: write: %w: %w", cmd, errdefs.ErrUnavailable, err)
	}
	for {
		select {
		case m := <-c.replies:
			// A reply with another id belongs to a command whose caller
			// gave up (ctx done); it is discarded so answers stay paired.
			if m.ID == nil || *m.ID != id {
				continue
			}
			if m.Error != nil {
				e := *m.Error
				e.Command = cmd
				return &e
			}
			if reply != nil && m.Return != nil {
				if err := json.Unmarshal(m.Return, reply); err != nil {
					return fmt.Errorf("qmp: %s: decode reply: %w", cmd, err)
				}
			}
			return nil
		case <-c.done:
			return fmt.Errorf("qmp: %s: connection closed: %w: %v", cmd, errdefs.ErrUnavailable, c.readErr)
		case <-ctx.Done():
			return fmt.Errorf("qmp: %s: %w", cmd, ctx.Err())
		}
	}
}

// Close ends the connection. It is safe to call more than once.
func (c *Client) Close() error {
	var err error
	c.closeOnce.Do(func() {
		close(c.closing)
		err = c.conn.Close()
		<-c.done
	})
	return err
}
