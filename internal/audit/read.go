package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Filter selects records for Scan, Read and Follow. The zero Filter selects
// everything.
type Filter struct {
	Refusals bool      // only records for which Record.Refusal is true
	Since    time.Time // only records at or after this time
	From     int64     // only records with Seq >= From
	// Sandbox, when set, selects only that one sandbox's records (see
	// Identity): what a sandbox is shown of itself.
	Sandbox Identity
}

// Identity tells one sandbox's records from those of earlier sandboxes of
// the same name. A log is kept by name and outlives `rm`, so a new sandbox
// that reuses a name appends to the log its predecessors wrote; what is
// shown as the sandbox's own (the refusals `smx agent ls` counts, what
// `smx-why` tells the agent) must begin where it does.
//
// A sandbox's part of the log begins at its sandbox.create record, which
// carries its ID (sandbox.Spec.ID, random, written once at create) as
// sandbox_id; a name is held by one sandbox at a time, so everything after
// that record is its own. A log begun after the sandbox was created (its
// log.create is not older: the log was pruned, or this is the name's
// first sandbox) is all its own too. A sandbox without an ID (made
// before IDs were kept) is told by time: records at or after Created.
type Identity struct {
	ID      string
	Created time.Time
}

// view follows one Identity through a log, record by record in order.
type view struct {
	id    Identity
	begun bool
}

func (id Identity) view() *view {
	return &view{id: id, begun: id.ID == "" && id.Created.IsZero()}
}

// byTime reports whether each record is judged by its time alone.
func (v *view) byTime() bool { return v.id.ID == "" && !v.id.Created.IsZero() }

// see reports whether r, the next record of the log, is the sandbox's own.
func (v *view) see(r Record) bool {
	if v.byTime() {
		return !r.Time.Before(v.id.Created)
	}
	if !v.begun {
		switch r.Kind {
		case KindSandboxCreate:
			id, _ := r.Fields["sandbox_id"].(string)
			v.begun = id == v.id.ID
		case KindLogCreate:
			v.begun = !r.Time.Before(v.id.Created)
		}
	}
	return v.begun
}

func (f Filter) match(r Record) bool {
	return r.Seq >= f.From && (!f.Refusals || r.Refusal()) && (f.Since.IsZero() || !r.Time.Before(f.Since))
}

// Scan calls fn for each record of the log in dir that f selects, in order.
// It reads without the writer lock, so it works while a writer appends and
// after the sandbox is gone; a torn last line (an append in progress) is not
// returned. Scan does not check hashes: that is Verify's job. If fn returns
// an error Scan stops and returns it.
func Scan(dir string, f Filter, fn func(Record) error) error {
	file, err := openRecords(dir)
	if err != nil {
		return err
	}
	defer file.Close()
	v := f.Sandbox.view()
	_, _, err = scanLines(file, func(line []byte) error {
		r, err := decodeRecord(line)
		if err != nil {
			return fmt.Errorf("audit: read %s: %v: run verify: %w", filepath.Join(dir, recordsFile), err, errdefs.ErrFailed)
		}
		if v.see(r) && f.match(r) {
			return fn(r)
		}
		return nil
	})
	return err
}

// Read returns the records Scan would visit.
func Read(dir string, f Filter) ([]Record, error) {
	var out []Record
	err := Scan(dir, f, func(r Record) error { out = append(out, r); return nil })
	return out, err
}

func openRecords(dir string) (*os.File, error) {
	file, err := os.Open(filepath.Join(dir, recordsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("audit: no log in %s: %w", dir, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	return file, nil
}

// FollowInterval is how often Follow polls for new records.
var FollowInterval = 200 * time.Millisecond

// Follow calls fn for each record f selects, first the ones already in the
// log, then each new one as it is committed, until ctx ends (it then returns
// nil) or fn fails. It polls the file; a record is seen once its newline is
// written, which may be just before its fsync returns.
func Follow(ctx context.Context, dir string, f Filter, fn func(Record) error) error {
	file, err := openRecords(dir)
	if err != nil {
		return err
	}
	defer file.Close()
	var pending []byte // an incomplete last line
	buf := make([]byte, 256<<10)
	var off int64
	v := f.Sandbox.view()
	tick := time.NewTicker(FollowInterval)
	defer tick.Stop()
	for {
		for {
			n, err := file.ReadAt(buf, off)
			off += int64(n)
			data := append(pending, buf[:n]...)
			for {
				i := bytes.IndexByte(data, '\n')
				if i < 0 {
					break
				}
				r, derr := decodeRecord(data[:i])
				if derr != nil {
					return fmt.Errorf("audit: follow %s: %v: run verify: %w", filepath.Join(dir, recordsFile), derr, errdefs.ErrFailed)
				}
				data = data[i+1:]
				if v.see(r) && f.match(r) {
					if err := fn(r); err != nil {
						return err
					}
				}
			}
			pending = append(pending[:0], data...)
			if len(pending) > maxLine {
				return fmt.Errorf("audit: follow %s: unterminated line over %d bytes: %w", filepath.Join(dir, recordsFile), maxLine, errdefs.ErrFailed)
			}
			if errors.Is(err, io.EOF) || n == 0 {
				break
			}
			if err != nil {
				return fmt.Errorf("audit: follow: %w", err)
			}
		}
		if st, err := file.Stat(); err == nil && st.Size() < off {
			if consumed := off - int64(len(pending)); st.Size() >= consumed {
				// A new writer cut the torn line we were holding.
				off, pending = consumed, pending[:0]
				continue
			}
			return fmt.Errorf("audit: follow %s: the file shrank (pruned or replaced): %w", filepath.Join(dir, recordsFile), errdefs.ErrFailed)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// CountRefusals counts the records of sandbox id in the log in dir for
// which Record.Refusal is true, as Scan with Filter{Refusals: true,
// Sandbox: id} would, but decodes only the lines that may be refusals or
// begin the sandbox's part of the log: `smx agent ls` counts them for
// every sandbox. The zero Identity counts the whole log.
func CountRefusals(dir string, id Identity) (int64, error) {
	file, err := openRecords(dir)
	if err != nil {
		return 0, err
	}
	defer file.Close()
	var n int64
	v := id.view()
	kindKey, refusedKey := []byte(`,"kind":"`), []byte(`"refused":true`)
	_, _, err = scanLines(file, func(line []byte) error {
		var kind []byte
		if k := bytes.Index(line, kindKey); k >= 0 {
			kind = line[k+len(kindKey):]
			if e := bytes.IndexByte(kind, '"'); e >= 0 {
				kind = kind[:e]
			}
		}
		if string(kind) == KindSandboxCreate || string(kind) == KindLogCreate { // boundary, without a copy
			if r, err := decodeRecord(line); err == nil {
				v.see(r)
			}
			return nil
		}
		refusedKind := bytes.HasSuffix(kind, []byte(".refused"))
		if !refusedKind && !bytes.Contains(line, refusedKey) {
			return nil
		}
		if refusedKind && !v.byTime() {
			if v.begun {
				n++
			}
			return nil
		}
		r, err := decodeRecord(line)
		if err == nil && v.see(r) && r.Refusal() {
			n++
		}
		return nil
	})
	return n, err
}
