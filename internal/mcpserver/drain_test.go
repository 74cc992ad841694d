package mcpserver_test

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/smx-dev/smx/internal/mcpserver"
)

// TestAnswerAllPiped: requests piped in and followed at once by the end of
// the input (`printf ... | smx mcp`) are all answered before the server
// returns; without AnswerAll the SDK cancels what is still queued when
// its reader sees the end.
func TestAnswerAllPiped(t *testing.T) {
	in := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}
{"jsonrpc":"2.0","method":"notifications/initialized"}
{"jsonrpc":"2.0","id":2,"method":"tools/list"}
{"jsonrpc":"2.0","id":"three","method":"ping"}
`
	for i := range 20 { // the loss was a race; make it show
		var out syncBuffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := mcpserver.New(nil, "test", nil).Run(ctx, mcpserver.AnswerAll(&mcp.IOTransport{
			Reader: io.NopCloser(strings.NewReader(in)), Writer: nopWriteCloser{&out}}))
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		got := out.String()
		for _, id := range []string{`"id":1,`, `"id":2,`, `"id":"three",`} {
			if !strings.Contains(got, id) {
				t.Fatalf("run %d: no answer with %s:\n%s", i, id, got)
			}
		}
		if !strings.Contains(got, `"sandbox_exec"`) {
			t.Fatalf("run %d: tools/list answer lists no tools:\n%s", i, got)
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
