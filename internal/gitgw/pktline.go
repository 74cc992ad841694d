package gitgw

import (
	"bytes"
	"errors"
	"fmt"
	"io"
)

// Git's pkt-line framing: four hex digits giving the length of the line
// including themselves, then the payload. 0000 is a flush, 0001 a delimiter
// (protocol v2), 0002 a response end (protocol v2). A length of 1..3 is
// invalid, as is one above MaxPktLen.

// MaxPktLen is the longest pkt-line git writes (LARGE_PACKET_MAX).
const MaxPktLen = 65520

// PktType says what ReadPkt read.
type PktType int

const (
	PktData PktType = iota
	PktFlush
	PktDelim
	PktEnd
)

// ErrPktLine is the class of framing errors.
var ErrPktLine = errors.New("gitgw: bad pkt-line")

// PktReader reads pkt-lines from an underlying reader. It never reads past
// the pkt-line it returns, so the rest of the stream (a pack) can be read
// from R afterwards. Payloads are valid until the next call.
type PktReader struct {
	R   io.Reader
	buf [MaxPktLen]byte
}

// ReadPkt reads one pkt-line. For PktData, payload is the line without its
// header (a trailing newline is kept).
func (p *PktReader) ReadPkt() (PktType, []byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(p.R, hdr[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return 0, nil, fmt.Errorf("%w: short header", ErrPktLine)
		}
		return 0, nil, err
	}
	n, ok := parseHex4(hdr)
	if !ok {
		return 0, nil, fmt.Errorf("%w: length %q is not four hex digits", ErrPktLine, hdr[:])
	}
	switch {
	case n == 0:
		return PktFlush, nil, nil
	case n == 1:
		return PktDelim, nil, nil
	case n == 2:
		return PktEnd, nil, nil
	case n < 4 || n > MaxPktLen:
		return 0, nil, fmt.Errorf("%w: length %d", ErrPktLine, n)
	}
	b := p.buf[:n-4]
	if _, err := io.ReadFull(p.R, b); err != nil {
		return 0, nil, fmt.Errorf("%w: truncated line: %v", ErrPktLine, err)
	}
	return PktData, b, nil
}

func parseHex4(h [4]byte) (int, bool) {
	n := 0
	for _, c := range h {
		n <<= 4
		switch {
		case c >= '0' && c <= '9':
			n |= int(c - '0')
		case c >= 'a' && c <= 'f':
			n |= int(c-'a') + 10
		case c >= 'A' && c <= 'F':
			n |= int(c-'A') + 10
		default:
			return 0, false
		}
	}
	return n, true
}

// AppendPkt appends payload as one pkt-line. Payloads longer than
// MaxPktLen-4 are cut; callers that can produce them split first.
func AppendPkt(dst []byte, payload []byte) []byte {
	if len(payload) > MaxPktLen-4 {
		payload = payload[:MaxPktLen-4]
	}
	dst = fmt.Appendf(dst, "%04x", len(payload)+4)
	return append(dst, payload...)
}

// PktString is one pkt-line holding s.
func PktString(s string) []byte { return AppendPkt(nil, []byte(s)) }

// Flush is the flush pkt-line.
var Flush = []byte("0000")

// ErrLine is Git's error pkt-line: a client reading it prints
// "remote error: MSG" (or "fatal: remote error: MSG") and stops.
func ErrLine(msg string) []byte { return PktString("ERR " + oneLine(msg) + "\n") }

// Sideband wraps data in side-band-64k packets on band (1 data, 2
// progress, 3 error).
func Sideband(band byte, data []byte) []byte {
	var out []byte
	for len(data) > 0 {
		n := min(len(data), MaxPktLen-5)
		out = fmt.Appendf(out, "%04x", n+5)
		out = append(out, band)
		out = append(out, data[:n]...)
		data = data[n:]
	}
	return out
}

func oneLine(s string) string {
	return string(bytes.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == 0 {
			return ' '
		}
		return r
	}, []byte(s)))
}
