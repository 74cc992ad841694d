package mcpserver

import (
	"context"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// AnswerAll returns t with one change: when the client's input ends, the
// connection reports the end only once every request read before it has
// been answered. The SDK cancels the requests in flight as soon as its
// reader sees the end, so `printf '...' | smx mcp` (or a host that closes
// stdin after its last request) would get no answer to the requests still
// queued. Closing the connection (an interrupt) still ends it at once.
//
// The SDK's own stdio connection learns the negotiated protocol version
// through an unexported method, which a wrapper cannot forward; it uses
// it only to refuse JSON-RPC batches from 2025-06-18 on, so behind
// AnswerAll batches are read in every version.
func AnswerAll(t mcp.Transport) mcp.Transport { return answerAll{t} }

type answerAll struct{ mcp.Transport }

func (t answerAll) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &answering{Connection: c, pending: map[jsonrpc.ID]bool{}, closed: make(chan struct{})}, nil
}

// answering tracks the ids of the calls read and not yet answered.
type answering struct {
	mcp.Connection
	mu        sync.Mutex
	pending   map[jsonrpc.ID]bool
	idle      chan struct{} // closed when pending empties; nil when nobody waits
	closed    chan struct{}
	closeOnce sync.Once
}

func (c *answering) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err == nil {
		if r, ok := msg.(*jsonrpc.Request); ok && r.IsCall() {
			c.mu.Lock()
			c.pending[r.ID] = true
			c.mu.Unlock()
		}
		return msg, nil
	}
	for {
		c.mu.Lock()
		if len(c.pending) == 0 {
			c.mu.Unlock()
			return nil, err
		}
		if c.idle == nil {
			c.idle = make(chan struct{})
		}
		idle := c.idle
		c.mu.Unlock()
		select {
		case <-idle:
		case <-c.closed:
			return nil, err
		case <-ctx.Done():
			return nil, err
		}
	}
}

func (c *answering) Write(ctx context.Context, msg jsonrpc.Message) error {
	err := c.Connection.Write(ctx, msg)
	// Answered, or tried to be: a failed write is not retried.
	if r, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		delete(c.pending, r.ID)
		if len(c.pending) == 0 && c.idle != nil {
			close(c.idle)
			c.idle = nil
		}
		c.mu.Unlock()
	}
	return err
}

func (c *answering) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Connection.Close()
}
