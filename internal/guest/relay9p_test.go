package guest

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"

	"github.com/smx-dev/smx/internal/fsgw"
	"github.com/smx-dev/smx/internal/policy"
)

// TestRelayRebuildsSession runs a relay between p9's client (standing in
// for the guest kernel) and the real file gateway, cuts the gateway
// connection as a restore does, reconnects to a new gateway session, and
// uses the fids opened, walked and renamed before the cut.
func TestRelayRebuildsSession(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the relay connects from a privileged port: run as root")
	}
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "d", "e"), 0o755)
	os.WriteFile(filepath.Join(dir, "d", "f.txt"), []byte("hello world"), 0o644)
	os.WriteFile(filepath.Join(dir, "d", "e", "g.txt"), []byte("deep"), 0o644)
	prof, err := policy.Parse("t.yaml", []byte("files:\n  rules:\n    - path: /work/**\n      access: rw\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := fsgw.New(fsgw.Config{Host: dir, Mount: policy.FileMount{Guest: "/work", Rule: "-v"},
		Profile: func() *policy.Profile { return prof }})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sessions := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			sessions <- c
			go gw.Serve(c)
		}
	}()
	r, kernel, err := newRelay("t0", "127.0.0.1", l.Addr().(*net.TCPAddr).Port, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer kernel.Close()
	client, err := p9.NewClient(kernel, p9.WithMessageSize(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	root, err := client.Attach("")
	if err != nil {
		t.Fatal(err)
	}
	_, f, err := root.Walk([]string{"d", "f.txt"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Open(p9.ReadWrite); err != nil {
		t.Fatal(err)
	}
	_, sub, err := root.Walk([]string{"d", "e"})
	if err != nil {
		t.Fatal(err)
	}
	_, d, err := root.Walk([]string{"d"})
	if err != nil {
		t.Fatal(err)
	}
	// A rename by this client moves the fids below it.
	if err := d.RenameAt("e", d, "e2"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if n, err := f.ReadAt(buf, 0); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("before: %q, %v", buf[:n], err)
	}

	// The restore: the old session's connection dies, and a read is
	// sent that the old gateway never answers.
	(<-sessions).Close()
	read := make(chan string, 1)
	go func() {
		b := make([]byte, 5)
		n, err := f.ReadAt(b, 6)
		read <- fmt.Sprint(string(b[:n]), err)
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		r.mu.Lock()
		n := len(r.pending)
		r.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the read never reached the relay")
		}
	}
	if err := r.reconnect(); err != nil {
		t.Fatal(err)
	}
	if got := <-read; got != "world<nil>" {
		t.Fatalf("a read in flight across the reconnect: %q", got)
	}
	if _, err := f.WriteAt([]byte("HELLO"), 0); err != nil {
		t.Fatalf("write after the reconnect: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "d", "f.txt")); string(b) != "HELLO world" {
		t.Fatalf("host file = %q", b)
	}
	_, g, err := sub.Walk([]string{"g.txt"})
	if err != nil {
		t.Fatalf("walk from a renamed directory's fid after the reconnect: %v", err)
	}
	if _, _, err := g.Open(p9.ReadOnly); err != nil {
		t.Fatal(err)
	}
	if n, err := g.ReadAt(buf, 0); err != nil && err != io.EOF || string(buf[:n]) != "deep" {
		t.Fatalf("g.txt: %q, %v", buf[:n], err)
	}
	// A new walk from the root works too, on the new session.
	if _, _, err := root.Walk([]string{"d", "e2", "g.txt"}); err != nil {
		t.Fatal(err)
	}
	if len(sessions) != 1 {
		t.Fatalf("%d gateway sessions after one reconnect, want 1 new", len(sessions))
	}
}

// FuzzRelayMessages feeds arbitrary requests and answers through the
// relay's bookkeeping: smx-agent is the guest's PID 1, so nothing a
// message holds may panic it.
func FuzzRelayMessages(f *testing.F) {
	f.Add(twalk(0, 1, []string{"a", "b"}), []byte{9, 0, 0, 0, 111, 0, 0, 2, 0})
	f.Add(tlopen(1, 2), []byte{7, 0, 0, 0, 13, 0, 0})
	f.Add(p9Msg(p9Trenameat, []byte{1, 0, 0, 0, 1, 0, 'x', 2, 0, 0, 0, 1, 0, 'y'}), []byte{7, 0, 0, 0, 75, 0, 0})
	f.Add(p9Msg(p9Tlcreate, []byte{1, 0, 0, 0, 1, 0, 'n', 2, 0, 0, 0}), []byte{7, 0, 0, 0, 15, 0, 0})
	f.Fuzz(func(t *testing.T, req, answer []byte) {
		if len(req) < p9Header || len(answer) < p9Header {
			return
		}
		r := &relay{fids: map[uint32]*relayFid{0: {raw: []byte{1}}, 1: {path: []string{"d"}}}, pending: map[uint16]*relayReq{}}
		binary.LittleEndian.PutUint16(answer[5:], binary.LittleEndian.Uint16(req[5:]))
		r.pending[binary.LittleEndian.Uint16(req[5:])] = parseRequest(req)
		r.answered(answer)
	})
}
