package api

import (
	"context"
	"encoding/base64"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/sandbox"
	"github.com/smx-dev/smx/internal/statedir"
)

// EventPoll is how often WatchEvents reads every sandbox's state besides
// inotify's word: it catches a supervisor that died without writing.
var EventPoll = 500 * time.Millisecond

// WireRecord is an audit record as the API sends it.
func WireRecord(r audit.Record) wire.Record {
	return wire.Record{Seq: r.Seq, Time: r.Time, Sandbox: r.Sandbox, Kind: r.Kind, Fields: r.Fields,
		Prev: base64.StdEncoding.EncodeToString(r.Prev[:]), Hash: base64.StdEncoding.EncodeToString(r.Hash[:])}
}

// lifecycle reports whether a record kind is a lifecycle change.
// approvalOf is the approval an approval.* record tells of (its state
// after the record), or nil.
func approvalOf(sandbox string, r audit.Record) *wire.Approval {
	state := map[string]string{
		audit.KindApprovalRequested: wire.ApprovalPending, audit.KindApprovalGranted: wire.ApprovalGranted,
		audit.KindApprovalDenied: wire.ApprovalDenied, audit.KindApprovalTimeout: wire.ApprovalTimeout,
	}[r.Kind]
	if state == "" {
		return nil
	}
	str := func(k string) string { s, _ := r.Fields[k].(string); return s }
	a := &wire.Approval{ID: str("id"), Sandbox: sandbox, Channel: str("channel"), What: str("what"), Rule: str("rule"), Source: str("source"),
		State: state, By: str("by"), RuleWritten: str("rule_written"), ProfileFile: str("profile_file")}
	switch {
	case state == wire.ApprovalGranted:
		a.Decision = str("scope")
	case state == wire.ApprovalDenied && a.By != "":
		a.Decision = wire.DecideDeny
	}
	if state == wire.ApprovalPending {
		a.Created = r.Time
		if t, err := time.Parse(time.RFC3339, str("expires")); err == nil {
			a.Expires = t
		}
	}
	return a
}

func lifecycle(kind string) bool {
	return strings.HasPrefix(kind, "sandbox.") || strings.HasPrefix(kind, "snapshot.") || kind == audit.KindProfileChange
}

// WatchEvents streams what happens under a state directory from now on,
// with no daemon: it watches the sandboxes' state files (inotify, and a
// poll that also catches a supervisor that died) and follows their signed
// logs. It first sends each selected sandbox's current status, then every
// change, and the logs' lifecycle records and refusals (all records with
// q.All). A status that lasts less than it takes to read the file may be
// skipped; a record never is. fn is called from one goroutine;
// WatchEvents returns when ctx ends (nil) or fn fails.
func WatchEvents(ctx context.Context, state statedir.Dir, q EventQuery, fn func(wire.Event) error) error {
	want := func(name string) bool { return len(q.Sandboxes) == 0 || slices.Contains(q.Sandboxes, name) }
	start := time.Now()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	records := make(chan wire.Event, 256)
	changed := make(chan string, 256) // a sandbox whose files changed; "" for all
	w := newDirWatcher(state.Sandboxes(), changed)
	defer w.close()
	m := &sandbox.Manager{State: state}
	prev := map[string]string{}
	followed := map[string]bool{}
	status := func(n string) error {
		if !want(n) || strings.HasPrefix(n, ".") {
			return nil
		}
		// Watch first: a state written between Get and the watch would
		// otherwise go unseen.
		w.add(n)
		cur := "removed"
		if in, err := m.Get(n); err == nil {
			cur = string(in.State.Status)
		}
		old, known := prev[n]
		if cur == old || (!known && cur == "removed") {
			return nil
		}
		if cur == "removed" {
			delete(prev, n)
		} else {
			prev[n] = cur
		}
		return fn(wire.Event{Time: time.Now().UTC(), Sandbox: n, Type: "status", Status: cur})
	}
	rescan := func() error {
		ents, _ := os.ReadDir(state.Sandboxes())
		names := map[string]bool{}
		for _, e := range ents {
			if e.IsDir() {
				names[e.Name()] = true
			}
		}
		for n := range prev {
			names[n] = true
		}
		sorted := slices.Sorted(maps.Keys(names))
		for _, n := range sorted {
			if err := status(n); err != nil {
				return err
			}
		}
		logs, _ := audit.List(state.Logs())
		for _, n := range logs {
			if followed[n] || !want(n) {
				continue
			}
			followed[n] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				audit.Follow(ctx, audit.Dir(state.Logs(), n), audit.Filter{Since: start}, func(r audit.Record) error {
					ap := approvalOf(n, r)
					if !q.All && !lifecycle(r.Kind) && !r.Refusal() && ap == nil {
						return nil
					}
					rec := WireRecord(r)
					ev := wire.Event{Time: r.Time, Sandbox: n, Type: "record", Refusal: r.Refusal(), Record: &rec}
					if ap != nil {
						ev.Type, ev.Approval = "approval", ap
					}
					select {
					case records <- ev:
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				})
			}()
		}
		return nil
	}
	tick := time.NewTicker(EventPoll)
	defer tick.Stop()
	if err := rescan(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-records:
			if err := fn(ev); err != nil {
				return err
			}
		case n := <-changed:
			var err error
			if n == "" {
				err = rescan()
			} else {
				err = status(n)
			}
			if err != nil {
				return err
			}
		case <-tick.C:
			if err := rescan(); err != nil {
				return err
			}
		}
	}
}

// dirWatcher reports changes under the sandboxes directory with inotify:
// a sandbox directory appearing or going (""), and a sandbox's state.json
// replaced (its name). Without inotify it reports nothing and the poll
// does the work.
type dirWatcher struct {
	f    *os.File
	fd   int // f's descriptor (f.Fd would make f blocking)
	root string
	mu   sync.Mutex
	wds  map[int]string // watch descriptor -> sandbox name ("" for the root)
	has  map[string]bool
}

func newDirWatcher(root string, changed chan<- string) *dirWatcher {
	w := &dirWatcher{wds: map[int]string{}, has: map[string]bool{}}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return w
	}
	wd, err := unix.InotifyAddWatch(fd, root, unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO|unix.IN_ONLYDIR)
	if err != nil {
		unix.Close(fd)
		return w
	}
	w.wds[wd] = ""
	w.f, w.fd = os.NewFile(uintptr(fd), "inotify"), fd
	w.root = root
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := w.f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				name := strings.TrimRight(string(nameBytes), "\x00")
				off += unix.SizeofInotifyEvent + int(ev.Len)
				w.mu.Lock()
				sb, ok := w.wds[int(ev.Wd)]
				if ok && sb != "" && ev.Mask&unix.IN_IGNORED != 0 {
					// The directory is gone: a sandbox of the same
					// name made later gets a watch of its own.
					delete(w.wds, int(ev.Wd))
					delete(w.has, sb)
				}
				w.mu.Unlock()
				if !ok || (sb != "" && name != "state.json") {
					continue
				}
				select {
				case changed <- sb:
				default: // the poll catches up
				}
			}
		}
	}()
	return w
}

func (w *dirWatcher) add(name string) {
	if w.f == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.has[name] {
		return
	}
	if _, err := os.Stat(filepath.Join(w.root, name)); err != nil {
		return
	}
	wd, err := unix.InotifyAddWatch(w.fd, filepath.Join(w.root, name), unix.IN_MOVED_TO|unix.IN_CLOSE_WRITE|unix.IN_ONLYDIR)
	if err == nil {
		w.wds[wd] = name
		w.has[name] = true
	}
}

func (w *dirWatcher) close() {
	if w.f != nil {
		w.f.Close()
	}
}
