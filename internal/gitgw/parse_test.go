package gitgw

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

const (
	oidA = "1111111111111111111111111111111111111111"
	oidB = "2222222222222222222222222222222222222222"
	zero = "0000000000000000000000000000000000000000"
)

func pkts(lines ...string) []byte {
	var b []byte
	for _, l := range lines {
		if l == "" {
			b = append(b, Flush...)
			continue
		}
		b = AppendPkt(b, []byte(l))
	}
	return b
}

func TestPktReader(t *testing.T) {
	in := append(pkts("hello\n", ""), []byte("00010002PACKrest")...)
	r := bytes.NewReader(in)
	pr := &PktReader{R: r}
	want := []PktType{PktData, PktFlush, PktDelim, PktEnd}
	for i, w := range want {
		typ, line, err := pr.ReadPkt()
		if err != nil || typ != w {
			t.Fatalf("pkt %d: %v %v", i, typ, err)
		}
		if i == 0 && string(line) != "hello\n" {
			t.Fatalf("payload %q", line)
		}
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "PACKrest" {
		t.Fatalf("reader went past the last pkt-line: rest %q", rest)
	}
	for _, bad := range []string{"0003", "00x1abc", "fff0", "0009abc", "00"} {
		_, _, err := (&PktReader{R: strings.NewReader(bad)}).ReadPkt()
		if !errors.Is(err, ErrPktLine) {
			t.Errorf("%q: %v, want ErrPktLine", bad, err)
		}
	}
}

func TestParsePushRequest(t *testing.T) {
	body := append(pkts(
		"shallow "+oidA,
		oidA+" "+oidB+" refs/heads/main\x00report-status side-band-64k atomic push-options agent=git/2.39",
		zero+" "+oidB+" refs/heads/new",
		oidA+" "+zero+" refs/heads/old",
		"",
		"ci.skip",
		"",
	), "PACK..."...)
	r := bytes.NewReader(body)
	p, err := ParsePushRequest(r)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Commands) != 3 || p.Commands[0].Ref != "refs/heads/main" || !p.Commands[1].IsCreate() || !p.Commands[2].IsDelete() {
		t.Fatalf("commands: %+v", p.Commands)
	}
	if !p.Has("atomic") || !p.Has("side-band-64k") || !p.Has("agent") || p.Has("ofs-delta") {
		t.Fatalf("caps: %v", p.Caps)
	}
	if len(p.Shallow) != 1 || len(p.Options) != 1 || p.Options[0] != "ci.skip" {
		t.Fatalf("shallow %v options %v", p.Shallow, p.Options)
	}
	rest, _ := io.ReadAll(r)
	if string(rest) != "PACK..." {
		t.Fatalf("pack: %q", rest)
	}
	// Re-encoding a subset round-trips.
	q, err := ParsePushRequest(bytes.NewReader(p.Encode(p.Commands[1:2])))
	if err != nil || len(q.Commands) != 1 || q.Commands[0] != p.Commands[1] || strings.Join(q.Caps, " ") != strings.Join(p.Caps, " ") ||
		len(q.Options) != 1 || len(q.Shallow) != 1 {
		t.Fatalf("re-encoded: %+v %v", q, err)
	}

	for name, bad := range map[string][]byte{
		"no caps":        pkts(oidA+" "+oidB+" refs/heads/main", ""),
		"short id":       pkts("111 "+oidB+" refs/heads/main\x00report-status", ""),
		"upper hex":      pkts(strings.ToUpper("a"+oidA[1:])+" "+oidB+" refs/heads/main\x00report-status", ""),
		"zero to zero":   pkts(zero+" "+zero+" refs/heads/main\x00report-status", ""),
		"no ref":         pkts(oidA+" "+oidB+" \x00report-status", ""),
		"nul later":      pkts(oidA+" "+oidB+" refs/heads/a\x00report-status", oidA+" "+oidB+" refs/heads/b\x00x", ""),
		"no flush":       pkts(oidA + " " + oidB + " refs/heads/main\x00report-status"),
		"no commands":    pkts(""),
		"push cert":      pkts("push-cert\x00report-status", ""),
		"delim":          append(pkts(oidA+" "+oidB+" refs/heads/main\x00report-status"), "0001"...),
		"mixed lengths":  pkts(oidA+" "+strings.Repeat("2", 64)+" refs/heads/main\x00report-status", ""),
		"options no end": pkts(oidA+" "+oidB+" refs/heads/main\x00push-options", "", "x"),
	} {
		if _, err := ParsePushRequest(bytes.NewReader(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestReport(t *testing.T) {
	rep := Report{Unpack: "ok", Refs: []RefStatus{
		{Ref: "refs/heads/a", OK: true, Extra: []string{"option refname refs/heads/a"}},
		{Ref: "refs/heads/main", Reason: "smx: push to refs/heads/main denied\nby rule"},
	}}
	got, err := ParseReport(bytes.NewReader(rep.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	if got.Unpack != "ok" || len(got.Refs) != 2 || !got.Refs[0].OK || got.Refs[1].Reason != "smx: push to refs/heads/main denied by rule" ||
		len(got.Refs[0].Extra) != 1 {
		t.Fatalf("%+v", got)
	}
	// Side-band: progress is passed on, data reassembled across packets.
	var progress []string
	stream := append(append(append(Sideband(2, []byte("working\n")), Sideband(1, rep.Encode()[:7])...), Sideband(1, rep.Encode()[7:])...), Flush...)
	data, err := Demux(bytes.NewReader(stream), func(b []byte) { progress = append(progress, string(b)) })
	if err != nil || !bytes.Equal(data, rep.Encode()) || len(progress) != 1 {
		t.Fatalf("demux: %v %q %q", err, data, progress)
	}
	if _, err := Demux(bytes.NewReader(append(Sideband(3, []byte("boom")), Flush...)), nil); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("band 3: %v", err)
	}
}

func FuzzPktLine(f *testing.F) {
	f.Add([]byte("0009hello0000"))
	f.Add([]byte("000100020003ffff"))
	f.Add([]byte("fff0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		pr := &PktReader{R: bytes.NewReader(b)}
		read := 0
		for i := 0; i < 1000; i++ {
			typ, line, err := pr.ReadPkt()
			if err != nil {
				return
			}
			read += 4 + len(line)
			if typ == PktData && (len(line) > MaxPktLen-4) {
				t.Fatalf("payload of %d bytes", len(line))
			}
			if read > len(b) {
				t.Fatalf("read %d of %d bytes", read, len(b))
			}
		}
	})
}

func FuzzPushRequest(f *testing.F) {
	f.Add(pkts(oidA+" "+oidB+" refs/heads/main\x00report-status push-options", zero+" "+oidB+" refs/heads/x", "", "opt", ""))
	f.Add(pkts("shallow "+oidA, oidA+" "+zero+" refs/tags/v1\x00atomic", ""))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParsePushRequest(bytes.NewReader(b))
		if err != nil {
			return
		}
		for _, c := range p.Commands {
			if !isOID(c.Old) || !isOID(c.New) || c.Ref == "" || strings.ContainsAny(c.Ref, "\x00\n") && !strings.HasSuffix(c.Ref, "\n") {
				t.Fatalf("accepted command %+v", c)
			}
			if c.IsCreate() && c.IsDelete() {
				t.Fatalf("zero to zero accepted: %+v", c)
			}
		}
		// What the gateway forwards parses back to the same commands.
		q, err := ParsePushRequest(bytes.NewReader(p.Encode(p.Commands)))
		if err != nil || len(q.Commands) != len(p.Commands) {
			t.Fatalf("re-encoding: %v", err)
		}
		for i := range q.Commands {
			if q.Commands[i] != p.Commands[i] {
				t.Fatalf("re-encoded %+v != %+v", q.Commands[i], p.Commands[i])
			}
		}
	})
}
