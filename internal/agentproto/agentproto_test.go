package agentproto

import (
	"bytes"
	"encoding/binary"
	"io"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, FrameRequest, Request{Op: OpExec, Exec: &ExecRequest{Args: []string{"true"}}}); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("x"), 3*DataChunk+5)
	if _, err := (FrameWriter{W: &buf, Type: FrameStdout}).Write(big); err != nil {
		t.Fatal(err)
	}
	WriteFrame(&buf, FrameEOF, nil)
	req, err := ReadRequest(&buf)
	if err != nil || req.Op != OpExec || req.Exec.Args[0] != "true" {
		t.Fatalf("request = %+v, %v", req, err)
	}
	var got []byte
	frames := 0
	for {
		typ, p, err := ReadFrame(&buf, nil)
		if err != nil {
			t.Fatal(err)
		}
		if typ == FrameEOF {
			break
		}
		frames++
		got = append(got, p...)
	}
	if !bytes.Equal(got, big) || frames != 4 {
		t.Fatalf("got %d bytes in %d frames", len(got), frames)
	}
}

// TestOversizedFrameRefused: a hostile peer cannot make the other side
// allocate more than MaxFrame.
func TestOversizedFrameRefused(t *testing.T) {
	var hdr [5]byte
	hdr[0] = byte(FrameStdout)
	binary.BigEndian.PutUint32(hdr[1:], MaxFrame+1)
	_, _, err := ReadFrame(bytes.NewReader(hdr[:]), nil)
	if err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("err = %v", err)
	}
	if err := WriteFrame(io.Discard, FrameStdout, make([]byte, MaxFrame+1)); err == nil {
		t.Fatal("oversized write accepted")
	}
}

func TestTruncatedFrame(t *testing.T) {
	var buf bytes.Buffer
	WriteFrame(&buf, FrameStdout, []byte("hello"))
	_, _, err := ReadFrame(bytes.NewReader(buf.Bytes()[:7]), nil)
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("err = %v, want unexpected EOF", err)
	}
}

func TestRequestMustComeFirst(t *testing.T) {
	var buf bytes.Buffer
	WriteFrame(&buf, FrameStdin, []byte("x"))
	if _, err := ReadRequest(&buf); err == nil {
		t.Fatal("a stream starting with stdin was accepted as a request")
	}
}
