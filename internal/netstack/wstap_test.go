package netstack

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/usage"
)

// wsFrame is one masked client frame.
func wsFrame(fin bool, op byte, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	f := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n < 1<<16:
		f = append(f, 0x80|126, 0, 0)
		binary.BigEndian.PutUint16(f[2:], uint16(n))
	default:
		f = append(f, 0x80|127, 0, 0, 0, 0, 0, 0, 0, 0)
		binary.BigEndian.PutUint64(f[2:], uint64(n))
	}
	mask := []byte{1, 2, 3, 4}
	f = append(f, mask...)
	for i, c := range payload {
		f = append(f, c^mask[i%4])
	}
	return f
}

// Each client message on a brokered WebSocket session is a cred.use record
// with its kind and size; control frames are not; fragments make one
// message.
func TestBrokerWebSocketMessages(t *testing.T) {
	t.Run("plain", func(t *testing.T) { testBrokerWebSocketMessages(t, nil) })
	// The gateway a supervisor runs always meters: an upgrade must pass.
	meter, _ := usage.NewMeter("", nil)
	t.Run("metered", func(t *testing.T) { testBrokerWebSocketMessages(t, meter) })
}

func testBrokerWebSocketMessages(t *testing.T, meter *usage.Meter) {
	got := make(chan int64, 1)
	addr, upRoots := upstreamTLS(t, "api.broker.test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" || r.Header.Get("Authorization") != "Bearer "+testSecret {
			http.Error(w, "want an upgrade with the key", http.StatusBadRequest)
			return
		}
		c, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: x\r\n\r\n")
		brw.Flush()
		n, _ := io.Copy(io.Discard, brw)
		got <- n
	}))
	r, ca := inspectRig(t, func(c *Config) { c.UpstreamRoots = upRoots; c.Meter = meter })
	r.route("tcp", "203.0.113.9:443", addr)
	r.resolve(t, "api.broker.test")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM())
	c, err := r.dialTCP(ctxT(t), "203.0.113.9:443")
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "api.broker.test", RootCAs: roots})
	io.WriteString(tc, "GET /v1/responses HTTP/1.1\r\nHost: api.broker.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer smx-placeholder\r\n\r\n")
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	var stream []byte
	stream = append(stream, wsFrame(true, 1, []byte("hello"))...)
	stream = append(stream, wsFrame(true, 2, make([]byte, 300))...)
	stream = append(stream, wsFrame(false, 1, []byte("ab"))...)
	stream = append(stream, wsFrame(true, 9, []byte("ping"))...) // control frame between fragments
	stream = append(stream, wsFrame(true, 0, []byte("cde"))...)
	stream = append(stream, wsFrame(true, 2, make([]byte, 70000))...)
	// Written in odd pieces: frame headers split across reads.
	for i := 0; i < len(stream); i += 7 {
		tc.Write(stream[i:min(i+7, len(stream))])
	}
	tc.Close()
	select {
	case n := <-got:
		if n != int64(len(stream)) {
			t.Errorf("upstream got %d bytes, want %d", n, len(stream))
		}
	case <-time.After(30 * time.Second): // 0.1 s alone; a loaded CI run once took more than 10 s
		t.Fatal("upstream never saw the stream end")
	}
	var msgs []string
	for end := time.Now().Add(5 * time.Second); len(msgs) < 4 && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		msgs = msgs[:0]
		for _, e := range r.eventsSnapshot() {
			if e.Kind == audit.KindCredUse && e.WebSocket != "" {
				f := e.Fields()
				msgs = append(msgs, e.WebSocket+":"+strconv.FormatInt(f["bytes"].(int64), 10)+":"+e.Path+":"+e.Credential)
			}
		}
	}
	want := []string{"text:5:/v1/responses:api", "binary:300:/v1/responses:api", "text:5:/v1/responses:api", "binary:70000:/v1/responses:api"}
	if strings.Join(msgs, ",") != strings.Join(want, ",") {
		t.Fatalf("messages recorded: %v, want %v", msgs, want)
	}
}
