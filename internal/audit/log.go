package audit

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/sys/unix"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/statedir"
)

// Options tune a Log. The zero value is what production wants.
type Options struct {
	// Signer signs checkpoints. Required.
	Signer note.Signer
	// CheckpointEvery is the longest a record waits for a checkpoint while
	// the log is active. Default one minute.
	CheckpointEvery time.Duration
	// SyncEach writes and fsyncs each record on its own instead of
	// batching concurrent appends. Same durability, far lower throughput;
	// it exists to measure what group commit buys.
	SyncEach bool
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Log is the writer of one sandbox's log. It is safe for concurrent use.
// Only one Log per directory exists at a time, across processes: Open
// holds an exclusive lock on DIR/lock until Close.
type Log struct {
	dir     string
	sandbox string
	logID   string
	opts    Options

	mu     sync.RWMutex // guards closed against sends on reqs
	closed bool
	reqs   chan *request
	done   chan struct{} // closed when the writer goroutine has finished
	err    error         // the writer's final error, valid after done

	// Owned by the writer goroutine.
	records  *os.File
	cps      *os.File
	lock     *statedir.Lock
	chain    chain // next seq, prev hash, tree
	lastTime time.Time
	cpSize   int64        // records covered by the last checkpoint
	uncov    *Span        // records found on Open that no checkpoint covered
	recEnd   int64        // size of records.jsonl
	broken   error        // sticky: a write or fsync failed
	syncs    atomic.Int64 // fdatasyncs of records.jsonl, for benchmarks
	buf, hb  []byte
}

type request struct {
	kind       string
	fields     map[string]any
	enc        []byte
	checkpoint bool
	done       chan result
}

type result struct {
	rec Record
	err error
}

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.-]*$`) })

// validName reports whether sandbox is a sandbox name (at most 63 bytes).
// The length is checked apart: a bounded repeat ({0,62}) compiles to a
// copy per count, which every smx process would pay for when it first
// checks a name.
func validName(sandbox string) bool { return len(sandbox) <= 63 && nameRE().MatchString(sandbox) }

var kindRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)+$`) })

// Dir is where the log of sandbox lives under root (the state directory's
// logs/ directory, which outlives sandboxes).
func Dir(root, sandbox string) string { return filepath.Join(root, sandbox) }

// Open opens the log in dir for appending, creating it if needed, with
// default Options.
func Open(dir, sandbox string, signer note.Signer) (*Log, error) {
	return OpenWith(dir, sandbox, Options{Signer: signer})
}

// OpenWith opens the log in dir for appending. If the last line of
// records.jsonl (or of checkpoints) is torn, that is, not newline
// terminated, it is cut off: such a line was never acknowledged, because
// Append returns only after the newline is on disk. Any other damage is an
// error wrapping errdefs.ErrFailed: appending to a broken chain would make
// later records worthless, so the user must Verify and Prune (or move the
// directory aside) first. A reopened log gets a log.open record saying
// whether the previous writer closed it and how many torn bytes were cut.
//
// A writer never signs what it did not write. Records after the last
// checkpoint of a log whose writer stopped without closing it (a crash, a
// kill -9, or a forger appending a plausible tail) are kept, but a
// log.unverified record naming them follows the log.open, and Verify
// reports them as unverified however many checkpoints follow. A record
// after a log.close that is not a log.open was written by no writer: Open
// fails, as for any other damage.
//
// Open reads the whole log to rebuild the chain and the tree (about as fast
// as Verify). It fails with errdefs.ErrInUse while another Log holds dir.
func OpenWith(dir, sandbox string, opts Options) (*Log, error) {
	if !validName(sandbox) {
		return nil, fmt.Errorf("audit: open: invalid sandbox name %q: %w", sandbox, errdefs.ErrInvalid)
	}
	if opts.Signer == nil {
		return nil, fmt.Errorf("audit: open: no signer: %w", errdefs.ErrInvalid)
	}
	if opts.CheckpointEvery <= 0 {
		opts.CheckpointEvery = time.Minute
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	l := &Log{dir: dir, sandbox: sandbox, opts: opts, reqs: make(chan *request, 1024), done: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			l.closeFiles()
		}
	}()
	var err error
	if l.lock, err = lockDir(dir); err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	if l.records, err = os.OpenFile(filepath.Join(dir, recordsFile), os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	if l.cps, err = os.OpenFile(filepath.Join(dir, checkpointsFile), os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	statedir.SyncDir(dir)
	repaired, err := l.load()
	if err != nil {
		return nil, err
	}
	ok = true
	go l.run()
	if l.chain.next == 0 {
		id := make([]byte, 8)
		_, _ = rand.Read(id)
		l.logID = hex.EncodeToString(id)
		_, err = l.append(context.Background(), KindLogCreate, map[string]any{"log_id": l.logID})
	} else {
		_, err = l.append(context.Background(), KindLogOpen, map[string]any{
			"clean": l.chain.lastKnd == KindLogClose, "repaired_bytes": repaired})
		if err == nil && l.uncov != nil {
			// This writer cannot vouch for records no signature covers:
			// say so in the log before any checkpoint of ours covers them.
			_, err = l.append(context.Background(), KindLogUnverified, map[string]any{
				"from": l.uncov.From, "to": l.uncov.To,
				"reason": "after the last checkpoint of a writer that stopped without closing the log"})
		}
	}
	if err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// lockDir takes the writer lock of a log directory without waiting.
func lockDir(dir string) (*statedir.Lock, error) {
	l, err := statedir.TryLock(filepath.Join(dir, lockFile))
	if errors.Is(err, statedir.ErrLocked) {
		return nil, fmt.Errorf("%s is held by another writer (the sandbox's supervisor): append through it: %w", dir, errdefs.ErrInUse)
	}
	return l, err
}

// load rebuilds the writer state from disk and cuts torn tails. It returns
// the number of torn bytes cut from records.jsonl.
func (l *Log) load() (int64, error) {
	// Checkpoints first, so the records pass can check the last one's root
	// as it goes: a writer must not extend a log whose signed past changed.
	var last Checkpoint
	cend, ctail, err := scanLines(l.cps, func(line []byte) error {
		c, err := openCheckpoint(line, nil)
		if err != nil {
			return err
		}
		if c.Size < last.Size {
			return fmt.Errorf("checkpoint sizes decrease (%d after %d)", c.Size, last.Size)
		}
		last = c
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("audit: open: %s: %v: the log is damaged; run verify: %w", filepath.Join(l.dir, checkpointsFile), err, errdefs.ErrFailed)
	}
	if err := cutTail(l.cps, cend, ctail); err != nil {
		return 0, fmt.Errorf("audit: open: repair %s: %w", checkpointsFile, err)
	}

	var problem *lineProblem
	var lastLine []byte
	end, tail, err := scanLines(l.records, func(line []byte) error {
		lastLine = append(lastLine[:0], line...)
		p := checkLine(line, &l.hb)
		if problem = l.chain.add(p); problem != nil {
			return errStop
		}
		if p.seq == 0 {
			r, err := decodeRecord(line)
			id, _ := r.Fields["log_id"].(string)
			if err != nil || r.Kind != KindLogCreate || id == "" {
				problem = &lineProblem{msg: "seq 0: not a log.create record with a log_id"}
				return errStop
			}
			if r.Sandbox != l.sandbox {
				problem = &lineProblem{msg: fmt.Sprintf("this is the log of sandbox %q, not %q", r.Sandbox, l.sandbox)}
				return errStop
			}
			l.logID = id
		}
		if l.chain.lines == last.Size && l.chain.tree.root() != last.Root {
			problem = &lineProblem{msg: fmt.Sprintf("records 0-%d do not match the last checkpoint", last.Size-1)}
			return errStop
		}
		return nil
	})
	if problem != nil {
		return 0, fmt.Errorf("audit: open: %s: %s: the log is damaged; run verify, then prune it or move it aside: %w",
			filepath.Join(l.dir, recordsFile), problem.msg, errdefs.ErrFailed)
	}
	if err != nil {
		return 0, fmt.Errorf("audit: open: %s: %w", filepath.Join(l.dir, recordsFile), err)
	}
	if err := cutTail(l.records, end, tail); err != nil {
		return 0, fmt.Errorf("audit: open: repair %s: %w", recordsFile, err)
	}
	l.recEnd = end
	if lastLine != nil {
		r, err := decodeRecord(lastLine)
		if err != nil {
			return 0, fmt.Errorf("audit: open: %s: last record: %v: %w", recordsFile, err, errdefs.ErrFailed)
		}
		l.lastTime = r.Time
	}
	if last.Size > l.chain.next {
		return 0, fmt.Errorf("audit: open: the last checkpoint covers %d records but only %d are on disk: records were lost; run verify: %w",
			last.Size, l.chain.next, errdefs.ErrFailed)
	}
	if l.chain.lastKnd == KindLogClose && last.Size < l.chain.next {
		// Close always checkpoints after log.close: a signature is missing.
		return 0, fmt.Errorf("audit: open: the log was closed but its last checkpoint covers %d of %d records: run verify: %w",
			last.Size, l.chain.next, errdefs.ErrFailed)
	}
	if last.Origin != "" && last.Origin != origin(l.sandbox, l.logID) {
		return 0, fmt.Errorf("audit: open: checkpoint origin %q is not this log's: run verify: %w", last.Origin, errdefs.ErrFailed)
	}
	l.cpSize = last.Size
	if last.Size < l.chain.next {
		l.uncov = &Span{From: last.Size, To: l.chain.next - 1}
	}
	if last.Time.After(l.lastTime) {
		l.lastTime = last.Time
	}
	return tail, nil
}

var errStop = errors.New("stop")

// cutTail truncates a torn, never-acknowledged tail and leaves the file
// offset at the end.
func cutTail(f *os.File, end, tail int64) error {
	if tail > 0 {
		if err := f.Truncate(end); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
	}
	_, err := f.Seek(end, 0)
	return err
}

// Append adds a record and returns it once it is durable: written and
// fsynced. Concurrent appends are committed together (one write, one fsync).
// fields are encoded as JSON; callers pass names of secrets, hosts, paths,
// never secret values. The kinds log.* are the log's own.
//
// If ctx ends first, Append returns its error; the record may still be
// committed afterwards.
func (l *Log) Append(ctx context.Context, kind string, fields map[string]any) (Record, error) {
	if !kindRE().MatchString(kind) || len(kind) > 64 || strings.HasPrefix(kind, "log.") {
		return Record{}, fmt.Errorf("audit: append: invalid kind %q: %w", kind, errdefs.ErrInvalid)
	}
	return l.append(ctx, kind, fields)
}

func (l *Log) append(ctx context.Context, kind string, fields map[string]any) (Record, error) {
	enc, err := encodeFields(fields)
	if err != nil {
		return Record{}, fmt.Errorf("audit: append %s: fields: %v: %w", kind, err, errdefs.ErrInvalid)
	}
	if len(enc) > maxLine-1024 {
		return Record{}, fmt.Errorf("audit: append %s: fields are %d bytes; summarise them below %d: %w", kind, len(enc), maxLine-1024, errdefs.ErrInvalid)
	}
	res, err := l.send(ctx, &request{kind: kind, fields: fields, enc: enc, done: make(chan result, 1)})
	return res.rec, err
}

// Checkpoint commits pending records and signs a checkpoint covering all of
// them, unless the last checkpoint already does. The log also checkpoints
// by itself: after every run.end record, every CheckpointEvery while records
// arrive, and on Close.
func (l *Log) Checkpoint(ctx context.Context) error {
	_, err := l.send(ctx, &request{checkpoint: true, done: make(chan result, 1)})
	return err
}

func (l *Log) send(ctx context.Context, req *request) (result, error) {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return result{}, fmt.Errorf("audit: %s: log is closed: %w", l.sandbox, errdefs.ErrFailed)
	}
	select {
	case l.reqs <- req:
	case <-ctx.Done():
		l.mu.RUnlock()
		return result{}, fmt.Errorf("audit: %s: %w", l.sandbox, ctx.Err())
	}
	l.mu.RUnlock()
	select {
	case res := <-req.done:
		return res, res.err
	case <-ctx.Done():
		return result{}, fmt.Errorf("audit: %s: %w (the record may still be committed)", l.sandbox, ctx.Err())
	}
}

// Close commits pending records, appends a log.close record and a final
// checkpoint, and releases the directory. It is idempotent; later calls
// return the first call's result.
func (l *Log) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.reqs)
	}
	l.mu.Unlock()
	<-l.done
	return l.err
}

// Sandbox names the log's sandbox; ID is the log's random id.
func (l *Log) Sandbox() string { return l.sandbox }
func (l *Log) ID() string      { return l.logID }

// run is the writer goroutine: it owns the files and all chain state.
func (l *Log) run() {
	defer close(l.done)
	tick := time.NewTicker(l.opts.CheckpointEvery)
	defer tick.Stop()
	var batch []*request
	for {
		select {
		case req, ok := <-l.reqs:
			if !ok {
				l.err = l.finish()
				return
			}
			batch = append(batch[:0], req)
		drain:
			for len(batch) < 4096 {
				select {
				case r, ok := <-l.reqs:
					if !ok {
						break drain // finish() runs on the next loop
					}
					batch = append(batch, r)
				default:
					break drain
				}
			}
			l.process(batch)
			clear(batch)
		case <-tick.C:
			if l.chain.next > l.cpSize {
				_ = l.checkpoint()
			}
		}
	}
}

// process commits a batch of requests in order. Checkpoint requests split
// the batch so a checkpoint covers every record queued before it.
func (l *Log) process(batch []*request) {
	start := 0
	for i, r := range batch {
		if r.checkpoint {
			l.commit(batch[start:i])
			err := l.broken
			if err == nil {
				err = l.checkpoint()
			}
			r.done <- result{err: err}
			start = i + 1
		}
	}
	l.commit(batch[start:])
}

func (l *Log) commit(reqs []*request) {
	if len(reqs) == 0 {
		return
	}
	if l.broken != nil {
		for _, r := range reqs {
			r.done <- result{err: l.broken}
		}
		return
	}
	if l.opts.SyncEach && len(reqs) > 1 {
		for i := range reqs {
			l.commit(reqs[i : i+1])
		}
		return
	}
	now := l.opts.Now().UTC()
	if now.Before(l.lastTime) {
		now = l.lastTime // keep time non-decreasing along the chain
	}
	recs := make([]Record, len(reqs))
	buf := l.buf[:0]
	prev, seq := l.chain.prev, l.chain.next
	runEnd := false
	for i, r := range reqs {
		recs[i] = Record{Seq: seq, Time: now, Sandbox: l.sandbox, Kind: r.kind, Fields: r.fields, Prev: prev}
		buf = encodeRecord(buf, &recs[i], r.enc, &l.hb)
		prev, seq = recs[i].Hash, seq+1
		runEnd = runEnd || r.kind == KindRunEnd || r.kind == KindLogCreate
	}
	l.buf = buf
	err := writeSync(l.records, buf)
	l.syncs.Add(1)
	if err != nil {
		// The file may hold part of the batch. Nothing was acknowledged, so
		// cutting back is safe; whether or not that works, the log stops
		// taking records (Linux forgets failed writeback after an fsync
		// error, so retrying could acknowledge lost data).
		if l.records.Truncate(l.recEnd) == nil {
			_, _ = l.records.Seek(l.recEnd, 0)
		}
		l.broken = fmt.Errorf("audit: %s: write %s: %v: %w", l.sandbox, recordsFile, err, errdefs.ErrFailed)
		for _, r := range reqs {
			r.done <- result{err: l.broken}
		}
		return
	}
	l.recEnd += int64(len(buf))
	for i := range recs {
		l.chain.tree.push(recs[i].Hash)
	}
	l.chain.prev, l.chain.next, l.chain.lastKnd, l.lastTime = prev, seq, recs[len(recs)-1].Kind, now
	for i, r := range reqs {
		r.done <- result{rec: recs[i]}
	}
	if runEnd {
		_ = l.checkpoint()
	}
}

func writeSync(f *os.File, b []byte) error {
	if _, err := f.Write(b); err != nil {
		return err
	}
	// fdatasync also persists the new file size, which is all the metadata
	// an append changes.
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err != unix.EINTR {
			return err
		}
	}
}

// checkpoint signs and appends a checkpoint covering every committed record.
func (l *Log) checkpoint() error {
	if l.broken != nil {
		return l.broken
	}
	if l.chain.next == l.cpSize {
		return nil
	}
	now := l.opts.Now().UTC()
	if now.Before(l.lastTime) {
		now = l.lastTime
	}
	c, err := signCheckpoint(Checkpoint{Origin: origin(l.sandbox, l.logID), Size: l.chain.next, Root: l.chain.tree.root(), Time: now}, l.opts.Signer)
	if err != nil {
		return fmt.Errorf("audit: %s: sign checkpoint: %w", l.sandbox, err)
	}
	if err := writeSync(l.cps, encodeCheckpointLine(c)); err != nil {
		l.broken = fmt.Errorf("audit: %s: write %s: %v: %w", l.sandbox, checkpointsFile, err, errdefs.ErrFailed)
		return l.broken
	}
	l.cpSize = c.Size
	return nil
}

// finish runs once the request channel is closed and drained.
func (l *Log) finish() error {
	var errs []error
	if l.broken == nil {
		done := make(chan result, 1)
		enc, _ := encodeFields(nil)
		l.commit([]*request{{kind: KindLogClose, enc: enc, done: done}})
		if res := <-done; res.err != nil {
			errs = append(errs, res.err)
		} else if err := l.checkpoint(); err != nil {
			errs = append(errs, err)
		}
	} else {
		errs = append(errs, l.broken)
	}
	errs = append(errs, l.closeFiles())
	return errors.Join(errs...)
}

func (l *Log) closeFiles() error {
	var errs []error
	for _, f := range []*os.File{l.records, l.cps} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	errs = append(errs, l.lock.Unlock())
	l.records, l.cps, l.lock = nil, nil, nil
	return errors.Join(errs...)
}
