package gitgw

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Command is one ref update of a push: Old and New are object ids in hex
// (all zeros for a create or a delete), Ref the full ref name as the
// client sent it.
type Command struct {
	Old, New, Ref string
}

// IsCreate and IsDelete say what the client claims; the gateway decides
// fast-forward itself (see Ancestry).
func (c Command) IsCreate() bool { return isZero(c.Old) }
func (c Command) IsDelete() bool { return isZero(c.New) }

func isZero(id string) bool { return strings.Trim(id, "0") == "" }

// PushRequest is the head of a receive-pack request (protocol v0/v1; a v2
// client pushes with v0): optional shallow lines, the commands (the first
// carries the client's capabilities after a NUL), a flush, and, when the
// push-options capability is used, the options and a flush. The pack, if
// any, follows in the stream.
type PushRequest struct {
	Shallow  []string
	Commands []Command
	Caps     []string
	Options  []string
}

// Limits on what a push head may hold.
const (
	maxCommands = 10000
	maxOptions  = 100
)

// Has reports whether the client asked for capability c (a name, or
// name=value for an exact match).
func (p *PushRequest) Has(c string) bool {
	for _, x := range p.Caps {
		if x == c || strings.HasPrefix(x, c+"=") {
			return true
		}
	}
	return false
}

// ParsePushRequest reads the head of a receive-pack request from r,
// leaving r at the start of the pack. Errors wrap ErrPktLine for framing
// and ErrPush for content.
func ParsePushRequest(r io.Reader) (*PushRequest, error) {
	pr := &PktReader{R: r}
	p := &PushRequest{}
	for {
		t, line, err := pr.ReadPkt()
		if err != nil {
			if err == io.EOF {
				return nil, fmt.Errorf("%w: request ends before its commands' flush", ErrPush)
			}
			return nil, err
		}
		if t == PktFlush {
			break
		}
		if t != PktData {
			return nil, fmt.Errorf("%w: unexpected special packet in commands", ErrPush)
		}
		line = bytes.TrimSuffix(line, []byte("\n"))
		if len(p.Commands) == 0 {
			if id, ok := bytes.CutPrefix(line, []byte("shallow ")); ok {
				if !isOID(string(id)) {
					return nil, fmt.Errorf("%w: bad shallow line", ErrPush)
				}
				if len(p.Shallow) >= maxCommands {
					return nil, fmt.Errorf("%w: too many shallow lines", ErrPush)
				}
				p.Shallow = append(p.Shallow, string(id))
				continue
			}
			if bytes.HasPrefix(line, []byte("push-cert")) {
				return nil, fmt.Errorf("%w: signed pushes (push-cert) are not supported", ErrPush)
			}
			cmd, caps, hasCaps := bytes.Cut(line, []byte{0})
			if !hasCaps {
				return nil, fmt.Errorf("%w: first command carries no capabilities", ErrPush)
			}
			line = cmd
			for _, c := range strings.Fields(string(caps)) {
				if len(p.Caps) < 64 {
					p.Caps = append(p.Caps, c)
				}
			}
		} else if bytes.IndexByte(line, 0) >= 0 {
			return nil, fmt.Errorf("%w: NUL in a command", ErrPush)
		}
		c, err := parseCommand(string(line))
		if err != nil {
			return nil, err
		}
		if len(p.Commands) >= maxCommands {
			return nil, fmt.Errorf("%w: more than %d commands", ErrPush, maxCommands)
		}
		p.Commands = append(p.Commands, c)
	}
	if len(p.Commands) == 0 {
		return nil, fmt.Errorf("%w: no commands", ErrPush)
	}
	if p.Has("push-options") {
		for {
			t, line, err := pr.ReadPkt()
			if err != nil {
				if err == io.EOF {
					return nil, fmt.Errorf("%w: request ends in its push options", ErrPush)
				}
				return nil, err
			}
			if t == PktFlush {
				break
			}
			if t != PktData || len(p.Options) >= maxOptions {
				return nil, fmt.Errorf("%w: bad push options", ErrPush)
			}
			p.Options = append(p.Options, string(bytes.TrimSuffix(line, []byte("\n"))))
		}
	}
	return p, nil
}

// ErrPush is the class of malformed push requests.
var ErrPush = errors.New("gitgw: bad push request")

func parseCommand(s string) (Command, error) {
	f := strings.SplitN(s, " ", 3)
	if len(f) != 3 || !isOID(f[0]) || !isOID(f[1]) || len(f[0]) != len(f[1]) || f[2] == "" {
		return Command{}, fmt.Errorf("%w: command %q is not OLD NEW REF", ErrPush, truncate(s, 200))
	}
	if isZero(f[0]) && isZero(f[1]) {
		return Command{}, fmt.Errorf("%w: command for %q has zero old and new ids", ErrPush, truncate(f[2], 200))
	}
	return Command{Old: f[0], New: f[1], Ref: f[2]}, nil
}

// isOID accepts SHA-1 and SHA-256 ids in lower-case hex.
func isOID(s string) bool {
	if len(s) != 40 && len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// Encode writes the head of a push request carrying only cmds (a subset
// of p.Commands, in order), with p's shallow lines, capabilities and
// options.
func (p *PushRequest) Encode(cmds []Command) []byte {
	var b []byte
	for _, s := range p.Shallow {
		b = AppendPkt(b, []byte("shallow "+s))
	}
	for i, c := range cmds {
		line := c.Old + " " + c.New + " " + c.Ref
		if i == 0 {
			line += "\x00" + strings.Join(p.Caps, " ")
		}
		b = AppendPkt(b, []byte(line))
	}
	b = append(b, Flush...)
	if p.Has("push-options") {
		for _, o := range p.Options {
			b = AppendPkt(b, []byte(o))
		}
		b = append(b, Flush...)
	}
	return b
}

// RefStatus is one ref's line in a report-status: OK, or refused with a
// reason (an "ng" line).
type RefStatus struct {
	Ref    string
	OK     bool
	Reason string
	// Extra holds report-status-v2 "option" lines that followed this
	// ref's line upstream, passed through unchanged.
	Extra []string
}

// Report is a receive-pack report-status.
type Report struct {
	Unpack string // "ok" or the error
	Refs   []RefStatus
}

// Encode renders the report as pkt-lines ending in a flush.
func (r Report) Encode() []byte {
	b := PktString("unpack " + oneLine(r.Unpack) + "\n")
	for _, s := range r.Refs {
		if s.OK {
			b = AppendPkt(b, []byte("ok "+s.Ref+"\n"))
		} else {
			b = AppendPkt(b, []byte("ng "+s.Ref+" "+oneLine(s.Reason)+"\n"))
		}
		for _, x := range s.Extra {
			b = AppendPkt(b, []byte(x+"\n"))
		}
	}
	return append(b, Flush...)
}

// ParseReport reads a report-status (v1 or v2) up to its flush.
func ParseReport(r io.Reader) (Report, error) {
	pr := &PktReader{R: r}
	var rep Report
	first := true
	for {
		t, line, err := pr.ReadPkt()
		if err != nil {
			if err == io.EOF {
				err = fmt.Errorf("%w: report ends early", ErrPktLine)
			}
			return rep, err
		}
		if t == PktFlush {
			if first {
				return rep, fmt.Errorf("%w: empty report", ErrPktLine)
			}
			return rep, nil
		}
		s := string(bytes.TrimSuffix(line, []byte("\n")))
		if first {
			u, ok := strings.CutPrefix(s, "unpack ")
			if !ok {
				return rep, fmt.Errorf("%w: report does not start with unpack", ErrPktLine)
			}
			rep.Unpack, first = u, false
			continue
		}
		switch {
		case strings.HasPrefix(s, "ok "):
			rep.Refs = append(rep.Refs, RefStatus{Ref: s[3:], OK: true})
		case strings.HasPrefix(s, "ng "):
			ref, reason, _ := strings.Cut(s[3:], " ")
			rep.Refs = append(rep.Refs, RefStatus{Ref: ref, Reason: reason})
		case strings.HasPrefix(s, "option ") && len(rep.Refs) > 0:
			last := &rep.Refs[len(rep.Refs)-1]
			last.Extra = append(last.Extra, s)
		default:
			return rep, fmt.Errorf("%w: unexpected report line %q", ErrPktLine, truncate(s, 100))
		}
		if len(rep.Refs) > maxCommands {
			return rep, fmt.Errorf("%w: report too long", ErrPktLine)
		}
	}
}

// Demux reads a side-band-64k stream up to its final flush: band 1 is
// returned, band 2 (progress) is passed to progress as it arrives, band 3
// (a fatal error) becomes the error.
func Demux(r io.Reader, progress func([]byte)) ([]byte, error) {
	pr := &PktReader{R: r}
	var data []byte
	for {
		t, line, err := pr.ReadPkt()
		if err != nil {
			if err == io.EOF {
				return data, fmt.Errorf("%w: side-band stream ends without a flush", ErrPktLine)
			}
			return data, err
		}
		if t == PktFlush {
			return data, nil
		}
		if t != PktData || len(line) == 0 {
			return data, fmt.Errorf("%w: bad side-band packet", ErrPktLine)
		}
		switch line[0] {
		case 1:
			if len(data)+len(line) > 64<<20 {
				return data, fmt.Errorf("%w: side-band data too long", ErrPktLine)
			}
			data = append(data, line[1:]...)
		case 2:
			if progress != nil {
				progress(slices.Clone(line[1:]))
			}
		case 3:
			return data, fmt.Errorf("upstream: %s", bytes.TrimSpace(line[1:]))
		default:
			return data, fmt.Errorf("%w: side-band %d", ErrPktLine, line[0])
		}
	}
}
