package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"

	"github.com/smx-dev/smx/internal/errdefs"
)

// VerifyReport is what Verify found. Problems are evidence of tampering or
// damage; Notes are normal states worth saying (an open log's records not
// yet checkpointed, a torn append).
type VerifyReport struct {
	Dir         string
	Sandbox     string
	LogID       string
	Records     int64       // complete lines in records.jsonl
	Checkpoints int         // lines in checkpoints
	Latest      *Checkpoint // the last checkpoint whose signature verified
	Closed      bool        // the last record is log.close
	Uncovered   int64       // records after the latest checkpoint
	FirstBad    int64       // seq of the first record that is bad, or not vouched for by the checkpoints of a closed log; -1 when none
	Problems    []string    // the first bad thing first; empty when the log verifies
	Notes       []string
	// Unverified are records that were after the last checkpoint when a
	// writer reopened the log: their writer stopped without closing it, so
	// no signature of theirs covers them and no later writer vouches for
	// them. They are not evidence of tampering (a crash leaves them), but
	// nothing proves who wrote them.
	Unverified []Span
}

// Span is a run of records, From to To inclusive. Marked is the seq of the
// log.unverified record that names the span, or -1 when the writer that
// reopened the log did not mark it.
type Span struct {
	From   int64 `json:"from"`
	To     int64 `json:"to"`
	Marked int64 `json:"marked"`
}

// UnverifiedCount is how many records are in r.Unverified.
func (r *VerifyReport) UnverifiedCount() int64 {
	var n int64
	for _, s := range r.Unverified {
		n += s.To - s.From + 1
	}
	return n
}

// OK reports whether the log verified.
func (r *VerifyReport) OK() bool { return len(r.Problems) == 0 }

// Err is nil when the log verified, else an error naming the first problem.
func (r *VerifyReport) Err() error {
	if r.OK() {
		return nil
	}
	more := ""
	if len(r.Problems) > 1 {
		more = fmt.Sprintf(" (and %d more problems)", len(r.Problems)-1)
	}
	return fmt.Errorf("audit: verify %s: %s%s: %w", r.Sandbox, r.Problems[0], more, errdefs.ErrFailed)
}

// String is a human summary, one finding per line.
func (r *VerifyReport) String() string {
	var b strings.Builder
	if r.OK() {
		fmt.Fprintf(&b, "ok: %d records", r.Records)
		if r.Latest != nil {
			fmt.Fprintf(&b, ", latest checkpoint covers %d, signed %s", r.Latest.Size, r.Latest.Time.Format("2006-01-02T15:04:05Z07:00"))
		}
		if n := r.UnverifiedCount(); n > 0 {
			fmt.Fprintf(&b, "; %d unverified", n)
		}
		b.WriteString("\n")
	} else {
		fmt.Fprintf(&b, "FAILED: %d problems\n", len(r.Problems))
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "  %s\n", p)
		}
	}
	for _, u := range r.Unverified {
		if !r.OK() {
			break // with bad checkpoints, what is unverified says little more
		}
		how := fmt.Sprintf("marked by log.unverified at seq %d", u.Marked)
		if u.Marked < 0 {
			how = "not marked: the log was reopened by an older smx"
		}
		fmt.Fprintf(&b, "unverified: %s: written after the last checkpoint by a writer that stopped without closing the log; no signature vouches for them (%s)\n",
			span(u.From, u.To), how)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	return b.String()
}

const maxProblems = 20

// Verify checks the log in dir against verifier, the checkpoint key:
//
//   - every checkpoint's signature, origin (this sandbox, this log id), and
//     that sizes and times never decrease (an older checkpoint put in place
//     of a newer one shows here);
//   - every record: well formed, its hash recomputed from its bytes, its seq
//     one more than the previous line's, its prev equal to the previous hash;
//   - the Merkle tree over the records' recomputed hashes against every
//     checkpoint's root at its size, so a record rewritten together with its
//     hash and every later prev is still caught, and located between the
//     last checkpoint that matches and the first that does not;
//   - that no checkpoint covers more records than the file has (a truncated
//     tail);
//   - that a log.close is followed by nothing but a log.open (a writer
//     always opens with one), so a tail appended to a closed log fails;
//   - which records were uncovered when a writer reopened the log (those
//     after the latest checkpoint at or before the log.open): they are
//     reported in Unverified, and a log.unverified record that names
//     anything else is a problem;
//   - that a cleanly closed log (last record log.close, always followed by a
//     checkpoint) is covered entirely by its latest checkpoint. Records after
//     the latest checkpoint of a log that is open, or whose writer crashed,
//     are a Note: they are not yet signed, so removing them is undetectable
//     until the next checkpoint (at most a minute of activity, or the end of
//     the current run).
//
// The error is for when Verify cannot run (no log: errdefs.ErrNotFound);
// what it finds is in the report (see OK and Err). Verify takes no lock and
// may run while a writer appends.
func Verify(dir string, verifier note.Verifier) (*VerifyReport, error) {
	return verify(dir, verifier, nil)
}

// VerifyRead is Verify that also returns the records it checked, decoded
// from the very bytes it hashed, so that a reader acting on the report
// (`smx profile learn`) cannot be handed a file changed between the
// check and the read. Records are returned whatever the report says; the
// caller decides from it which to trust (those below Latest.Size, outside
// Unverified, when OK).
func VerifyRead(dir string, verifier note.Verifier) (*VerifyReport, []Record, error) {
	var recs []Record
	rep, err := verify(dir, verifier, func(r Record) { recs = append(recs, r) })
	return rep, recs, err
}

func verify(dir string, verifier note.Verifier, keep func(Record)) (*VerifyReport, error) {
	rep := &VerifyReport{Dir: dir, FirstBad: -1}
	recFile, err := openRecords(dir)
	if err != nil {
		return nil, err
	}
	defer recFile.Close()
	// Checkpoints are read first: the records pass compares tree roots at
	// their sizes as it goes, so it never keeps more than the tree's edge.
	cps, cpProblems, err := readCheckpoints(dir, verifier, rep)
	if err != nil {
		return nil, err
	}
	bySize := map[int64][]int{}
	for i, c := range cps {
		if c.ok {
			bySize[c.Size] = append(bySize[c.Size], i)
		}
	}

	var (
		ch          chain
		hb          []byte
		recProblems []*lineProblem
		seqFound    = map[int64]bool{}
		lastGood    = -1 // index into cps of the last checkpoint whose root matched
		rootBad     []string
		markBad     []string
		markWant    = -1 // index into rep.Unverified the next record should mark
	)
	check := func() {
		for _, i := range bySize[ch.lines] {
			if ch.tree.root() == cps[i].Root {
				if cps[i].Size > sizeOf(cps, lastGood) {
					lastGood = i
				}
				continue
			}
			from := sizeOf(cps, lastGood)
			rootBad = append(rootBad, fmt.Sprintf("checkpoint %d (size %d): tree root does not match the records: a record in seq %d-%d was changed, removed or inserted after it was signed",
				cps[i].n, cps[i].Size, from, cps[i].Size-1))
			if rep.FirstBad < 0 || from < rep.FirstBad {
				rep.FirstBad = from
			}
		}
	}
	check() // a size-0 checkpoint
	_, tail, err := scanLines(recFile, func(line []byte) error {
		p := checkLine(line, &hb)
		if keep != nil && p.err == "" {
			if r, err := decodeRecord(line); err == nil && r.Seq == p.seq {
				keep(r)
			}
		}
		if ch.lines == 0 && p.err == "" {
			if r, err := decodeRecord(line); err == nil && r.Kind == KindLogCreate {
				rep.Sandbox = r.Sandbox
				rep.LogID, _ = r.Fields["log_id"].(string)
			}
		}
		// Checkpoints up to this record's seq have been checked: the latest
		// good one is what a writer reopening here could vouch for.
		covered := sizeOf(cps, lastGood)
		lp := ch.add(p)
		if lp != nil {
			if lp.seqOrder {
				seqFound[lp.found] = true
			}
			if len(recProblems) < maxProblems {
				recProblems = append(recProblems, lp)
			}
		}
		want := markWant
		markWant = -1
		if lp == nil {
			switch p.kind {
			case KindLogOpen:
				if covered < p.seq {
					rep.Unverified = append(rep.Unverified, Span{From: covered, To: p.seq - 1, Marked: -1})
					markWant = len(rep.Unverified) - 1
				}
			case KindLogUnverified:
				r, _ := decodeRecord(line)
				from, _ := r.Fields["from"].(json.Number)
				to, _ := r.Fields["to"].(json.Number)
				if want >= 0 && from.String() == strconv.FormatInt(rep.Unverified[want].From, 10) && to.String() == strconv.FormatInt(rep.Unverified[want].To, 10) {
					rep.Unverified[want].Marked = p.seq
				} else if len(markBad) < maxProblems {
					markBad = append(markBad, fmt.Sprintf("seq %d: log.unverified names records %s-%s, which are not the records left uncovered when the log was reopened", p.seq, from, to))
				}
			}
		}
		check()
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("audit: verify %s: %w", filepath.Join(dir, recordsFile), err)
	}
	rep.Records = ch.lines
	rep.Closed = ch.lastKnd == KindLogClose
	if tail > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("records.jsonl ends in a torn line of %d bytes: an append in progress, or a crash; the next writer removes it", tail))
	}

	// Record problems, most precise wording first.
	for _, lp := range recProblems {
		msg := lp.msg
		if lp.seqOrder {
			switch {
			case lp.found > lp.expected && seqFound[lp.expected]:
				msg = fmt.Sprintf("seq %d: at line %d, before seq %d: records were reordered", lp.found, lp.line, lp.expected)
			case lp.found > lp.expected:
				msg = fmt.Sprintf("seq %d: at line %d where seq %d belongs: %s deleted", lp.found, lp.line, lp.expected, wasWere(span(lp.expected, lp.found-1)))
			default:
				msg = fmt.Sprintf("seq %d: at line %d, after seq %d: records were reordered or duplicated", lp.found, lp.line, lp.expected-1)
			}
		}
		rep.Problems = append(rep.Problems, msg)
	}
	if len(recProblems) > 0 {
		rep.FirstBad = recProblems[0].expected
	}
	if rep.Sandbox == "" {
		rep.Problems = append(rep.Problems, "seq 0: not a log.create record naming the sandbox and log id")
	}
	rep.Problems = append(rep.Problems, cpProblems...)
	want := origin(rep.Sandbox, rep.LogID)
	for _, c := range cps {
		if c.ok && rep.Sandbox != "" && c.Origin != want {
			rep.Problems = append(rep.Problems, fmt.Sprintf("checkpoint %d: origin %q is not this log's (%q): it was taken from another log", c.n, c.Origin, want))
		}
	}
	rep.Problems = append(rep.Problems, rootBad...)
	rep.Problems = append(rep.Problems, markBad...)

	// Coverage.
	var latest *verifiedCheckpoint
	for i := range cps {
		if cps[i].ok {
			latest = &cps[i]
		}
	}
	if latest != nil {
		c := latest.Checkpoint
		rep.Latest = &c
		if c.Size > rep.Records {
			rep.Problems = append(rep.Problems, fmt.Sprintf("checkpoint %d covers %d records but the log has %d: %s removed (the log was truncated)",
				latest.n, c.Size, rep.Records, wasWere(span(rep.Records, c.Size-1))))
			if rep.FirstBad < 0 {
				rep.FirstBad = rep.Records
			}
		}
	}
	covered := int64(0)
	if latest != nil {
		covered = min(latest.Size, rep.Records)
	}
	rep.Uncovered = rep.Records - covered
	if rep.Uncovered > 0 {
		sp := isAre(span(covered, rep.Records-1))
		switch {
		case rep.Closed && latest == nil:
			rep.Problems = append(rep.Problems, fmt.Sprintf("the log was closed but has no valid checkpoint: %s not covered by any signature (checkpoints removed?)", sp))
		case rep.Closed:
			rep.Problems = append(rep.Problems, fmt.Sprintf("the log was closed at seq %d, but the latest checkpoint (checkpoint %d) covers only %d of %d records: %s not covered by any signature (the last checkpoint was removed or replaced by an older one)",
				rep.Records-1, latest.n, covered, rep.Records, sp))
		default:
			rep.Notes = append(rep.Notes, fmt.Sprintf("%s not yet covered by a checkpoint: the log is open, or its writer stopped without closing it", sp))
		}
		if rep.Closed && rep.FirstBad < 0 {
			rep.FirstBad = covered
		}
	}
	return rep, nil
}

type verifiedCheckpoint struct {
	Checkpoint
	n  int  // 1-based position in the checkpoints file
	ok bool // signature verified and text well formed
}

func sizeOf(cps []verifiedCheckpoint, i int) int64 {
	if i < 0 {
		return 0
	}
	return cps[i].Size
}

// readCheckpoints opens every checkpoint with verifier and checks that sizes
// and times never decrease.
func readCheckpoints(dir string, verifier note.Verifier, rep *VerifyReport) ([]verifiedCheckpoint, []string, error) {
	f, err := os.Open(filepath.Join(dir, checkpointsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("audit: verify: %w", err)
	}
	defer f.Close()
	var (
		cps      []verifiedCheckpoint
		problems []string
		prev     verifiedCheckpoint
	)
	_, tail, err := scanLines(f, func(line []byte) error {
		vc := verifiedCheckpoint{n: len(cps) + 1}
		c, err := openCheckpoint(line, verifier)
		if err != nil {
			problems = append(problems, fmt.Sprintf("checkpoint %d: %v", vc.n, err))
			cps = append(cps, vc)
			return nil
		}
		vc.Checkpoint, vc.ok = c, true
		if prev.ok {
			switch {
			case c.Size < prev.Size:
				problems = append(problems, fmt.Sprintf("checkpoint %d: size %d is smaller than checkpoint %d's %d: an older checkpoint was put in place of a newer one", vc.n, c.Size, prev.n, prev.Size))
			case c.Time.Before(prev.Time):
				problems = append(problems, fmt.Sprintf("checkpoint %d: signed at %s, before checkpoint %d (%s): checkpoints were reordered", vc.n, c.Time.Format("2006-01-02T15:04:05.999Z07:00"), prev.n, prev.Time.Format("2006-01-02T15:04:05.999Z07:00")))
			}
		}
		cps = append(cps, vc)
		prev = vc
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("audit: verify %s: %w", filepath.Join(dir, checkpointsFile), err)
	}
	rep.Checkpoints = len(cps)
	if tail > 0 {
		rep.Notes = append(rep.Notes, fmt.Sprintf("checkpoints ends in a torn line of %d bytes: a crash while checkpointing; the next writer removes it", tail))
	}
	return cps, problems, nil
}

func wasWere(span string) string {
	if strings.HasPrefix(span, "records") {
		return span + " were"
	}
	return span + " was"
}

func isAre(span string) string {
	if strings.HasPrefix(span, "records") {
		return span + " are"
	}
	return span + " is"
}
