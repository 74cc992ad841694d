// Package sniff reads the first bytes of a TCP stream and says what
// destination they name: the server name of a TLS ClientHello, or the
// Host, absolute-form authority or CONNECT target of an HTTP/1.x request
// head. The network gateway uses it to hold domain rules against streams
// that name another domain than the one the flow was allowed for. Parsing
// is strict (anything malformed is an error wrapping ErrMalformed), bounded
// and fuzzed.
package sniff

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
)

// What the guest's first bytes on a flow say about where it means to go.
const (
	TLS    = "tls"    // a TLS ClientHello
	HTTP   = "http"   // an HTTP/1.x request head
	Opaque = "opaque" // anything else: carries no name to check
)

// Bounds on what the gateway reads before it decides.
const (
	maxHelloBytes = 64 << 10 // ClientHello records (post-quantum key shares make hellos ~2 KiB; 64 KiB is generous)
	maxHeadBytes  = 16 << 10 // HTTP request line and headers
)

// ErrMalformed is wrapped by the errors for streams that start like TLS or
// HTTP but do not parse as such.
var ErrMalformed = errors.New("malformed")

// Result is the outcome of peeking at a flow.
type Result struct {
	Kind   string
	Prefix []byte // every byte read from the guest, to be replayed upstream
	Skip   int    // HTTP: empty-line bytes (CR, LF) before the request line

	// TLS
	Hello ClientHello

	// HTTP
	Method  string
	Target  string   // request target as sent
	Hosts   []string // authority of an absolute-form target, then every Host header value
	Connect string   // CONNECT target (host:port)
}

// Read reads the guest's first bytes from r (which should carry a read
// deadline) and classifies them. A stream that starts like TLS or HTTP must
// parse as such; an error wrapping ErrMalformed says it did not.
func Read(r io.Reader) (Result, error) {
	p := &peeker{r: r}
	if err := p.need(1); err != nil {
		return Result{Prefix: p.buf}, err
	}
	if p.buf[0] == 0x16 { // TLS handshake record
		h, err := readClientHello(p)
		return Result{Kind: TLS, Prefix: p.buf, Hello: h}, err
	}
	// Servers and proxies ignore empty lines before a request line (RFC
	// 9112 2.2; nginx, Apache, HAProxy skip any number of CR and LF), so a
	// request is classified after them, as the upstream will parse it.
	skip := 0
	for {
		if skip == len(p.buf) {
			if skip >= maxHeadBytes {
				return Result{Kind: HTTP, Prefix: p.buf}, fmt.Errorf("%w HTTP: %d bytes of empty lines", ErrMalformed, skip)
			}
			if err := p.need(skip + 1); err != nil {
				return Result{Prefix: p.buf}, err
			}
		}
		if c := p.buf[skip]; c != '\r' && c != '\n' {
			break
		}
		skip++
	}
	if b := p.buf[skip]; b < 'A' || b > 'Z' {
		return Result{Kind: Opaque, Prefix: p.buf}, nil
	}
	// An HTTP method is a token; read until the first non-token byte.
	i := skip
	for {
		if i == len(p.buf) {
			if i-skip >= 24 || p.need(i+1) != nil {
				return Result{Kind: Opaque, Prefix: p.buf}, nil
			}
		}
		c := p.buf[i]
		if c >= 'A' && c <= 'Z' || c == '-' || c == '_' {
			i++
			continue
		}
		if c != ' ' {
			return Result{Kind: Opaque, Prefix: p.buf}, nil
		}
		break
	}
	s, err := readHTTPHead(p, skip)
	s.Prefix, s.Skip = p.buf, skip
	return s, err
}

// peeker accumulates what it reads, so it can all be replayed.
type peeker struct {
	r   io.Reader
	buf []byte
}

// need reads until at least n bytes are buffered.
func (p *peeker) need(n int) error {
	for len(p.buf) < n {
		if cap(p.buf)-len(p.buf) < 512 {
			nb := make([]byte, len(p.buf), max(2*cap(p.buf), n+512, 1024))
			copy(nb, p.buf)
			p.buf = nb
		}
		m, err := p.r.Read(p.buf[len(p.buf):cap(p.buf)])
		p.buf = p.buf[:len(p.buf)+m]
		if len(p.buf) >= n {
			return nil
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// ClientHello is what the gateway needs from a TLS ClientHello.
type ClientHello struct {
	SNI    string // host_name from server_name; "" when there is none
	HasSNI bool
	ALPN   []string
}

// readClientHello reads TLS records from p until the first handshake
// message is complete and parses it as a ClientHello.
func readClientHello(p *peeker) (ClientHello, error) {
	var msg []byte
	off := 0
	for {
		if err := p.need(off + 5); err != nil {
			return ClientHello{}, err
		}
		hdr := p.buf[off : off+5]
		if hdr[0] != 0x16 {
			return ClientHello{}, fmt.Errorf("%w TLS: record type %d before the ClientHello ended", ErrMalformed, hdr[0])
		}
		if hdr[1] != 3 {
			return ClientHello{}, fmt.Errorf("%w TLS: record version %d.%d", ErrMalformed, hdr[1], hdr[2])
		}
		n := int(hdr[3])<<8 | int(hdr[4])
		if n == 0 || n > 16384 {
			return ClientHello{}, fmt.Errorf("%w TLS: record length %d", ErrMalformed, n)
		}
		if off+5+n > maxHelloBytes {
			return ClientHello{}, fmt.Errorf("%w TLS: ClientHello longer than %d bytes", ErrMalformed, maxHelloBytes)
		}
		if err := p.need(off + 5 + n); err != nil {
			return ClientHello{}, err
		}
		msg = append(msg, p.buf[off+5:off+5+n]...)
		off += 5 + n
		if len(msg) >= 4 {
			if msg[0] != 1 {
				return ClientHello{}, fmt.Errorf("%w TLS: handshake type %d, not ClientHello", ErrMalformed, msg[0])
			}
			l := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
			if 4+l > maxHelloBytes {
				return ClientHello{}, fmt.Errorf("%w TLS: ClientHello longer than %d bytes", ErrMalformed, maxHelloBytes)
			}
			if len(msg) >= 4+l {
				if len(msg) > 4+l {
					// Nothing may follow the ClientHello before the server answers.
					return ClientHello{}, fmt.Errorf("%w TLS: data after the ClientHello", ErrMalformed)
				}
				return ParseClientHello(msg[4:])
			}
		}
	}
}

// ParseClientHello parses the body of a ClientHello handshake message
// (RFC 8446 4.1.2, RFC 6066 3, RFC 7301 3.1). It rejects anything
// malformed, trailing bytes, duplicate extensions and more than one
// host_name, as a TLS server would, so the name the gateway checks is the
// name the upstream will see.
func ParseClientHello(b []byte) (ClientHello, error) {
	var h ClientHello
	r := byteReader{b: b}
	bad := func(what string) (ClientHello, error) {
		return ClientHello{}, fmt.Errorf("%w ClientHello: %s", ErrMalformed, what)
	}
	if _, ok := r.bytes(2 + 32); !ok {
		return bad("short version/random")
	}
	if sid, ok := r.vec8(); !ok || len(sid) > 32 {
		return bad("session id")
	}
	if cs, ok := r.vec16(); !ok || len(cs) == 0 || len(cs)%2 != 0 {
		return bad("cipher suites")
	}
	if cm, ok := r.vec8(); !ok || len(cm) == 0 {
		return bad("compression methods")
	}
	if r.empty() {
		return h, nil // no extensions: no SNI
	}
	exts, ok := r.vec16()
	if !ok || !r.empty() {
		return bad("extensions")
	}
	er := byteReader{b: exts}
	seen := map[uint16]bool{}
	for !er.empty() {
		typ, ok1 := er.u16()
		data, ok2 := er.vec16()
		if !ok1 || !ok2 {
			return bad("extension")
		}
		if seen[typ] {
			return bad("duplicate extension " + strconv.Itoa(int(typ)))
		}
		seen[typ] = true
		switch typ {
		case 0: // server_name
			dr := byteReader{b: data}
			list, ok := dr.vec16()
			if !ok || !dr.empty() || len(list) == 0 {
				return bad("server_name")
			}
			lr := byteReader{b: list}
			for !lr.empty() {
				nt, ok1 := lr.u8()
				name, ok2 := lr.vec16()
				if !ok1 || !ok2 {
					return bad("server_name entry")
				}
				if nt != 0 {
					continue
				}
				if h.HasSNI {
					return bad("two host_name entries")
				}
				if len(name) == 0 || len(name) > 253+1 || strings.ContainsFunc(string(name), func(c rune) bool { return c <= ' ' || c >= 0x7f }) {
					return bad("host_name")
				}
				h.SNI, h.HasSNI = strings.ToLower(string(name)), true
			}
		case 16: // application_layer_protocol_negotiation
			dr := byteReader{b: data}
			list, ok := dr.vec16()
			if !ok || !dr.empty() || len(list) == 0 {
				return bad("ALPN")
			}
			lr := byteReader{b: list}
			for !lr.empty() {
				p, ok := lr.vec8()
				if !ok || len(p) == 0 {
					return bad("ALPN protocol")
				}
				h.ALPN = append(h.ALPN, string(p))
			}
		}
	}
	return h, nil
}

type byteReader struct{ b []byte }

func (r *byteReader) empty() bool { return len(r.b) == 0 }

func (r *byteReader) bytes(n int) ([]byte, bool) {
	if n < 0 || len(r.b) < n {
		return nil, false
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out, true
}

func (r *byteReader) u8() (int, bool) {
	b, ok := r.bytes(1)
	if !ok {
		return 0, false
	}
	return int(b[0]), true
}

func (r *byteReader) u16() (uint16, bool) {
	b, ok := r.bytes(2)
	if !ok {
		return 0, false
	}
	return uint16(b[0])<<8 | uint16(b[1]), true
}

func (r *byteReader) vec8() ([]byte, bool) {
	n, ok := r.u8()
	if !ok {
		return nil, false
	}
	return r.bytes(n)
}

func (r *byteReader) vec16() ([]byte, bool) {
	n, ok := r.u16()
	if !ok {
		return nil, false
	}
	return r.bytes(int(n))
}

// readHTTPHead reads an HTTP/1.x request line and headers from p and
// collects every name the request gives for its destination.
func readHTTPHead(p *peeker, skip int) (Result, error) {
	s := Result{Kind: HTTP}
	end := -1
	for end < 0 {
		if i := bytes.Index(p.buf[skip:], []byte("\r\n\r\n")); i >= 0 {
			end = skip + i + 4
			break
		}
		if i := bytes.Index(p.buf[skip:], []byte("\n\n")); i >= 0 {
			end = skip + i + 2
			break
		}
		if len(p.buf) >= maxHeadBytes {
			return s, fmt.Errorf("%w HTTP: request head longer than %d bytes", ErrMalformed, maxHeadBytes)
		}
		if err := p.need(len(p.buf) + 1); err != nil {
			return s, err
		}
	}
	return parseHTTPHead(p.buf[skip:end])
}

// parseHTTPHead parses a complete request head (through the blank line).
func parseHTTPHead(head []byte) (Result, error) {
	s := Result{Kind: HTTP}
	bad := func(what string) (Result, error) {
		return s, fmt.Errorf("%w HTTP: %s", ErrMalformed, what)
	}
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	line, err := tp.ReadLine()
	if err != nil {
		return bad("request line")
	}
	parts := strings.Split(line, " ")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || !strings.HasPrefix(parts[2], "HTTP/1.") {
		return bad("request line " + strconv.Quote(trim(line, 100)))
	}
	s.Method, s.Target = parts[0], parts[1]
	hdr, err := tp.ReadMIMEHeader()
	if err != nil {
		return bad("headers: " + err.Error())
	}
	hosts := hdr.Values("Host")
	if len(hosts) > 1 {
		return bad("more than one Host header")
	}
	switch {
	case s.Method == "CONNECT":
		if _, _, err := net.SplitHostPort(s.Target); err != nil {
			return bad("CONNECT target " + strconv.Quote(trim(s.Target, 100)))
		}
		s.Connect = s.Target
	case strings.HasPrefix(s.Target, "/") || s.Target == "*":
	default:
		u, err := url.Parse(s.Target)
		if err != nil || u.Host == "" {
			return bad("request target " + strconv.Quote(trim(s.Target, 100)))
		}
		s.Hosts = append(s.Hosts, u.Host)
	}
	s.Hosts = append(s.Hosts, hosts...)
	return s, nil
}

func trim(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// HostOnly strips the port from an authority ("a.example:8080",
// "[2001:db8::1]:443") and lower-cases it.
func HostOnly(authority string) string {
	h := authority
	if host, _, err := net.SplitHostPort(authority); err == nil {
		h = host
	} else if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
	}
	return strings.ToLower(h)
}
