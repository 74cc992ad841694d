package sniff

import (
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

func TestSniffHelloFromCryptoTLS(t *testing.T) {
	for _, tc := range []struct {
		sni  string
		alpn []string
	}{{"api.example.com", []string{"h2", "http/1.1"}}, {"", nil}} {
		hello := captureHello(t, &tls.Config{ServerName: tc.sni, NextProtos: tc.alpn, InsecureSkipVerify: true})
		s, err := Read(bytes.NewReader(hello))
		if err != nil || s.Kind != TLS || s.Hello.SNI != tc.sni || s.Hello.HasSNI != (tc.sni != "") ||
			strings.Join(s.Hello.ALPN, ",") != strings.Join(tc.alpn, ",") || !bytes.Equal(s.Prefix, hello) {
			t.Errorf("sniff(hello for %q) = %+v, %v", tc.sni, s.Hello, err)
		}
		// Split across two records, as a client may.
		split := splitRecord(hello, 100)
		if s, err := Read(bytes.NewReader(split)); err != nil || s.Hello.SNI != tc.sni {
			t.Errorf("split hello: %+v, %v", s.Hello, err)
		}
	}
}

// captureHello returns the first flight crypto/tls sends as a client.
func captureHello(t testing.TB, cfg *tls.Config) []byte {
	a, b := net.Pipe()
	go func() {
		tls.Client(a, cfg).Handshake()
	}()
	var out []byte
	buf := make([]byte, 64<<10)
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		n, err := b.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			t.Fatal(err)
		}
		if len(out) >= 5 && len(out) >= 5+int(out[3])<<8|int(out[4]) {
			break
		}
	}
	a.Close()
	b.Close()
	return out
}

// splitRecord re-frames a one-record hello as two records.
func splitRecord(rec []byte, at int) []byte {
	body := rec[5:]
	var out []byte
	for _, part := range [][]byte{body[:at], body[at:]} {
		out = append(out, rec[0], rec[1], rec[2], byte(len(part)>>8), byte(len(part)))
		out = append(out, part...)
	}
	return out
}

func FuzzParseClientHello(f *testing.F) {
	f.Add(captureHello(f, &tls.Config{ServerName: "a.example", NextProtos: []string{"http/1.1"}}))
	f.Add(captureHello(f, &tls.Config{InsecureSkipVerify: true}))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"))
	f.Add([]byte("CONNECT a:1 HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Read(bytes.NewReader(data))
		if !bytes.Equal(s.Prefix, data[:len(s.Prefix)]) {
			t.Fatalf("prefix is not what was read")
		}
		if err == nil && s.Kind == TLS && s.Hello.HasSNI && s.Hello.SNI == "" {
			t.Fatalf("empty SNI accepted")
		}
		if err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("unexpected error kind: %v", err)
		}
		if len(data) > 4 {
			ParseClientHello(data[4:])
		}
	})
}

func TestReadHTTP(t *testing.T) {
	for _, tc := range []struct {
		in      string
		kind    string
		hosts   string
		connect string
		bad     bool
	}{
		{in: "GET / HTTP/1.1\r\nHost: a.example:8080\r\n\r\nbody", kind: HTTP, hosts: "a.example:8080"},
		{in: "GET http://b.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n", kind: HTTP, hosts: "b.example,a.example"},
		{in: "CONNECT c.example:443 HTTP/1.1\r\nHost: c.example:443\r\n\r\n", kind: HTTP, hosts: "c.example:443", connect: "c.example:443"},
		{in: "GET / HTTP/1.0\n\n", kind: HTTP},
		{in: "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", bad: true},
		{in: "CONNECT nope HTTP/1.1\r\n\r\n", bad: true},
		{in: "GET /\r\n\r\n", bad: true},
		{in: "GET x HTTP/1.1\r\n\r\n", bad: true},
		{in: "SSH-2.0-OpenSSH_9\r\n", kind: Opaque},
		{in: "\x00\x01binary", kind: Opaque},
		{in: "ABCDEFGHIJKLMNOPQRSTUVWXYZABCDEF", kind: Opaque},
		{in: "GET / HTTP/1.1\r\nHost: a\r\n", bad: true}, // EOF inside the head
		// Empty lines before the request line are skipped, as servers do
		// (RFC 9112 2.2), so what follows is still read as a request.
		{in: "\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n", kind: HTTP, hosts: "other.test"},
		{in: "\r\n\n\r\nCONNECT other.test:443 HTTP/1.1\r\n\r\n", kind: HTTP, connect: "other.test:443"},
		{in: "\n\nGET / HTTP/1.0\n\n", kind: HTTP},
		{in: "\r\n\r\nSSH-2.0-x\r\n", kind: Opaque},
		{in: strings.Repeat("\r\n", 9000), bad: true},
	} {
		r, err := Read(strings.NewReader(tc.in))
		if tc.bad {
			if err == nil {
				t.Errorf("Read(%q) = %+v, want an error", tc.in, r)
			}
			continue
		}
		if err != nil || r.Kind != tc.kind || strings.Join(r.Hosts, ",") != tc.hosts || r.Connect != tc.connect {
			t.Errorf("Read(%q) = %+v, %v", tc.in, r, err)
		}
		if !strings.HasPrefix(tc.in, string(r.Prefix)) {
			t.Errorf("Read(%q): prefix %q", tc.in, r.Prefix)
		}
	}
	if got := HostOnly("[2001:DB8::1]:443"); got != "2001:db8::1" {
		t.Errorf("HostOnly = %q", got)
	}
}
