package audit

import (
	"bufio"
	"errors"
	"fmt"
	"io"

	"golang.org/x/mod/sumdb/tlog"
)

// maxLine bounds a stored line; Append refuses records that would exceed it.
const maxLine = 64 << 10

const (
	recordsFile     = "records.jsonl"
	checkpointsFile = "checkpoints"
	lockFile        = "lock"
)

// scanLines calls fn for each newline-terminated line of r (without the
// newline) and returns the offset just past the last such line and the
// length of an unterminated tail, which is a torn append if anything.
func scanLines(r io.Reader, fn func(line []byte) error) (end, tail int64, err error) {
	br := bufio.NewReaderSize(r, 1<<20)
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case err == nil:
			end += int64(len(line))
			if err := fn(line[:len(line)-1]); err != nil {
				return end, 0, err
			}
		case errors.Is(err, bufio.ErrBufferFull):
			return end, 0, fmt.Errorf("line at offset %d is longer than %d bytes", end, br.Size())
		case errors.Is(err, io.EOF):
			return end, int64(len(line)), nil
		default:
			return end, 0, err
		}
	}
}

// chain checks record lines in file order: each hash, seq continuity and
// prev linking, and feeds the Merkle tree. It is shared by Open (which stops
// at the first problem) and Verify (which reports it).
type chain struct {
	next    int64     // seq expected next
	prev    tlog.Hash // hash of the last record
	tree    frontier
	lines   int64
	lastKnd string
	hb      []byte
}

// lineProblem is what is wrong with one line.
type lineProblem struct {
	line     int64 // 1-based line number
	expected int64 // seq expected at this line
	found    int64 // seq found (for seq problems)
	seqOrder bool  // the problem is the seq number
	msg      string
}

// add checks one parsed line and returns what is wrong with it, or nil.
// The tree always takes the line's recomputed hash, so the tree root is the
// root of what is on disk whatever the stored hashes say.
func (c *chain) add(p parsedLine) *lineProblem {
	c.lines++
	lp := &lineProblem{line: c.lines, expected: c.next, found: p.seq}
	if p.err != "" {
		c.tree.push(tlog.Hash{}) // keep positions aligned
		c.next++
		lp.msg = fmt.Sprintf("line %d (where seq %d belongs): %s", lp.line, lp.expected, p.err)
		return lp
	}
	c.tree.push(p.calc)
	prevKind := c.lastKnd
	c.lastKnd = p.kind
	switch {
	case p.seq != c.next:
		lp.seqOrder = true
		lp.msg = fmt.Sprintf("seq %d: expected seq %d at line %d", p.seq, c.next, lp.line)
	case p.calc != p.hash:
		lp.msg = fmt.Sprintf("seq %d: hash mismatch: the record was changed after it was written", p.seq)
	case p.prev != c.prev:
		lp.msg = fmt.Sprintf("seq %d: prev does not match the hash of seq %d", p.seq, p.seq-1)
	case prevKind == KindLogClose && p.kind != KindLogOpen:
		// A writer always starts with log.open; anything else after a
		// close was appended by something that is not the log's writer.
		lp.msg = fmt.Sprintf("seq %d: %s record after log.close (seq %d) without log.open: the log's writer did not write it", p.seq, p.kind, p.seq-1)
	default:
		lp = nil
	}
	// After a seq anomaly, keep expecting the successor of the highest seq
	// seen, so one swapped pair is reported once, not at every later line.
	if p.seq+1 >= c.next {
		c.next = p.seq + 1
		c.prev = p.hash
	}
	return lp
}

// span names records a..b for messages.
func span(a, b int64) string {
	if a == b {
		return fmt.Sprintf("record %d", a)
	}
	return fmt.Sprintf("records %d-%d", a, b)
}
