package netstack

import (
	"encoding/binary"
	"net"
	"sync/atomic"
)

// A brokered WebSocket session (Codex opens wss://…/v1/responses) is one
// HTTP request, so without this it would be one cred.use record however many
// model requests it carries. wsTap sits on the guest's side of a terminated
// connection; once the handler arms it for an upgrade, it parses the
// client's frames as they are read (nothing is changed or held back) and
// reports each complete client message (text or binary; control frames
// are not) with its payload size.
type wsTap struct {
	net.Conn
	armed  atomic.Pointer[wsParser]
	report func(opcode byte, size int64)
}

func (t *wsTap) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	if ps := t.armed.Load(); ps != nil && n > 0 {
		ps.feed(p[:n])
	}
	return n, err
}

// arm starts parsing client frames; disarm stops (the upgrade did not
// happen or is over).
func (t *wsTap) arm()    { t.armed.Store(&wsParser{report: t.report}) }
func (t *wsTap) disarm() { t.armed.Store(nil) }

// wsParser is an incremental RFC 6455 frame parser over the client's byte
// stream: header bytes are collected until the header is complete, payload
// bytes are counted and skipped.
type wsParser struct {
	report  func(opcode byte, size int64)
	hdr     []byte
	skip    uint64 // payload bytes of the current frame still to come
	msgOp   byte   // opcode of the message being assembled (1 text, 2 binary)
	msgSize int64
	frameOp byte
	fin     bool
	broken  bool
}

func (w *wsParser) feed(b []byte) {
	for len(b) > 0 && !w.broken {
		if w.skip > 0 {
			n := min(uint64(len(b)), w.skip)
			w.skip -= n
			b = b[n:]
			if w.skip == 0 {
				w.frameDone()
			}
			continue
		}
		w.hdr = append(w.hdr, b[0])
		b = b[1:]
		need, ok := wsHeaderLen(w.hdr)
		if !ok || len(w.hdr) < need {
			continue
		}
		w.fin, w.frameOp = w.hdr[0]&0x80 != 0, w.hdr[0]&0x0f
		var size uint64
		switch l := w.hdr[1] & 0x7f; l {
		case 126:
			size = uint64(binary.BigEndian.Uint16(w.hdr[2:4]))
		case 127:
			size = binary.BigEndian.Uint64(w.hdr[2:10])
		default:
			size = uint64(l)
		}
		if size > 1<<40 {
			w.broken = true // not a WebSocket stream we understand; stop counting
			return
		}
		w.hdr = w.hdr[:0]
		if w.frameOp == 1 || w.frameOp == 2 {
			w.msgOp, w.msgSize = w.frameOp, 0
		}
		if w.frameOp <= 2 {
			w.msgSize += int64(size)
		}
		w.skip = size
		if size == 0 {
			w.frameDone()
		}
	}
}

func (w *wsParser) frameDone() {
	if w.frameOp <= 2 && w.fin && w.msgOp != 0 {
		w.report(w.msgOp, w.msgSize)
		w.msgOp, w.msgSize = 0, 0
	}
}

// wsHeaderLen is the length of the frame header begun in h, once h holds
// enough of it to tell.
func wsHeaderLen(h []byte) (int, bool) {
	if len(h) < 2 {
		return 0, false
	}
	n := 2
	switch h[1] & 0x7f {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h[1]&0x80 != 0 {
		n += 4 // client frames are masked
	}
	return n, true
}
