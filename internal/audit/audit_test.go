package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/smx-dev/smx/internal/errdefs"
)

var update = flag.Bool("update", false, "rewrite testdata/v1 (the committed test vector)")

func testKey(t testing.TB) *Key {
	t.Helper()
	k, err := LoadOrCreateKey(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// fakeClock ticks one millisecond per call, so records get distinct times.
func fakeClock(start time.Time) func() time.Time {
	var mu sync.Mutex
	t := start
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t = t.Add(time.Millisecond)
		return t
	}
}

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// makeLog writes a closed log: log.create (checkpoint 1, size 1), records
// 1-10, an explicit checkpoint (2, size 11), records 11-15 ending with
// run.end (checkpoint 3, size 16), then log.close (checkpoint 4, size 17).
func makeLog(t testing.TB, dir string, k *Key) {
	t.Helper()
	l, err := OpenWith(dir, "dev", Options{Signer: k.Signer(), Now: fakeClock(t0)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 1; i <= 15; i++ {
		kind, fields := KindExecStart, map[string]any{"n": i, "argv": []string{"make", "test"}}
		switch {
		case i == 3:
			kind, fields = KindNetRefused, map[string]any{"n": i, "host": "evil.example", "rule": "default deny"}
		case i == 15:
			kind, fields = KindRunEnd, map[string]any{"n": i, "exit": 0, "duration_ms": 1200}
		}
		if _, err := l.Append(ctx, kind, fields); err != nil {
			t.Fatal(err)
		}
		if i == 10 {
			if err := l.Checkpoint(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func readLines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
}

func writeLines(t testing.TB, path string, lines []string) {
	t.Helper()
	s := strings.Join(lines, "")
	if !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mustVerify(t testing.TB, dir string, v note.Verifier) *VerifyReport {
	t.Helper()
	rep, err := Verify(dir, v)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestFrontierMatchesTlog(t *testing.T) {
	var stored []tlog.Hash
	r := tlog.HashReaderFunc(func(idx []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(idx))
		for i, x := range idx {
			out[i] = stored[x]
		}
		return out, nil
	})
	var f frontier
	for n := int64(0); n < 300; n++ {
		want, err := tlog.TreeHash(n, r)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.root(); got != want {
			t.Fatalf("size %d: root %v, tlog says %v", n, got, want)
		}
		data := []byte(fmt.Sprintf("record %d", n))
		hs, err := tlog.StoredHashes(n, data, r)
		if err != nil {
			t.Fatal(err)
		}
		stored = append(stored, hs...)
		f.push(tlog.RecordHash(data))
	}
}

func TestRoundTrip(t *testing.T) {
	k := testKey(t)
	dir := t.TempDir()
	makeLog(t, dir, k)

	rep := mustVerify(t, dir, k.Verifier())
	if !rep.OK() || rep.Records != 17 || rep.Checkpoints != 4 || !rep.Closed || rep.Uncovered != 0 || rep.Sandbox != "dev" {
		t.Fatalf("report: %+v\n%s", rep, rep)
	}
	recs, err := Read(dir, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 17 || recs[0].Kind != KindLogCreate || recs[16].Kind != KindLogClose {
		t.Fatalf("records: %+v", recs)
	}
	if recs[5].Fields["n"] != json.Number("5") || recs[5].Prev != recs[4].Hash {
		t.Errorf("record 5: %+v", recs[5])
	}
	ref, _ := Read(dir, Filter{Refusals: true})
	if len(ref) != 1 || ref[0].Fields["host"] != "evil.example" {
		t.Errorf("refusals: %+v", ref)
	}
	since, _ := Read(dir, Filter{Since: recs[12].Time})
	if len(since) != 5 || since[0].Seq != 12 {
		t.Errorf("since: %d records from %d", len(since), since[0].Seq)
	}
	j, err := json.Marshal(recs[3])
	if err != nil || !bytes.Contains(j, []byte(`"prev":"`)) || !bytes.Contains(j, []byte(`"kind":"net.refused"`)) {
		t.Errorf("json: %s %v", j, err)
	}

	// Reopen: a log.open says the previous writer closed cleanly.
	l, err := Open(dir, "dev", k.Signer())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(context.Background(), KindSandboxStop, nil); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Append(context.Background(), KindSandboxStop, nil); !errors.Is(err, errdefs.ErrFailed) {
		t.Errorf("append after close: %v", err)
	}
	recs, _ = Read(dir, Filter{From: 17})
	if len(recs) != 3 || recs[0].Kind != KindLogOpen || recs[0].Fields["clean"] != true || recs[2].Kind != KindLogClose {
		t.Fatalf("after reopen: %+v", recs)
	}
	if rep := mustVerify(t, dir, k.Verifier()); !rep.OK() || rep.Records != 20 {
		t.Fatalf("after reopen:\n%s", rep)
	}
}

func TestAppendRefusesBadInput(t *testing.T) {
	k := testKey(t)
	l, err := Open(t.TempDir(), "dev", k.Signer())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	for _, kind := range []string{"", "run", "Run.start", "log.close", "a b.c", "x.y\n"} {
		if _, err := l.Append(ctx, kind, nil); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("kind %q: %v", kind, err)
		}
	}
	if _, err := l.Append(ctx, "x.y", map[string]any{"f": func() {}}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("unencodable field: %v", err)
	}
	if _, err := l.Append(ctx, "x.y", map[string]any{"big": strings.Repeat("a", maxLine)}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("huge field: %v", err)
	}
	if _, err := Open(t.TempDir(), "../x", k.Signer()); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bad sandbox name: %v", err)
	}
}

// TestTamper is the list: each change to a closed log is detected
// and its first problem names what happened and where.
func TestTamper(t *testing.T) {
	k := testKey(t)
	other := testKey(t)
	recPath := func(dir string) string { return filepath.Join(dir, recordsFile) }
	cpPath := func(dir string) string { return filepath.Join(dir, checkpointsFile) }

	tests := []struct {
		name     string
		tamper   func(t *testing.T, dir string)
		want     string // substring of the first problem
		firstBad int64
	}{{
		name: "edit a field",
		tamper: func(t *testing.T, dir string) {
			lines := readLines(t, recPath(dir))
			lines[5] = strings.Replace(lines[5], `"n":5`, `"n":50`, 1)
			writeLines(t, recPath(dir), lines)
		},
		want:     "seq 5: hash mismatch: the record was changed after it was written",
		firstBad: 5,
	}, {
		name: "delete a record",
		tamper: func(t *testing.T, dir string) {
			lines := readLines(t, recPath(dir))
			writeLines(t, recPath(dir), append(lines[:5:5], lines[6:]...))
		},
		want:     "seq 6: at line 6 where seq 5 belongs: record 5 was deleted",
		firstBad: 5,
	}, {
		name: "reorder two records",
		tamper: func(t *testing.T, dir string) {
			lines := readLines(t, recPath(dir))
			lines[5], lines[6] = lines[6], lines[5]
			writeLines(t, recPath(dir), lines)
		},
		want:     "seq 6: at line 6, before seq 5: records were reordered",
		firstBad: 5,
	}, {
		name: "truncate the tail",
		tamper: func(t *testing.T, dir string) {
			lines := readLines(t, recPath(dir))
			writeLines(t, recPath(dir), lines[:14])
		},
		want:     "checkpoint 4 covers 17 records but the log has 14: records 14-16 were removed (the log was truncated)",
		firstBad: 14,
	}, {
		name: "replace the last checkpoint with an older one",
		tamper: func(t *testing.T, dir string) {
			lines := readLines(t, cpPath(dir))
			lines[3] = lines[1]
			writeLines(t, cpPath(dir), lines)
		},
		want:     "checkpoint 4: size 11 is smaller than checkpoint 3's 16: an older checkpoint was put in place of a newer one",
		firstBad: 11,
	}, {
		name: "replace the checkpoints file with an older copy",
		tamper: func(t *testing.T, dir string) {
			lines := readLines(t, cpPath(dir))
			writeLines(t, cpPath(dir), lines[:2])
		},
		want:     "the log was closed at seq 16, but the latest checkpoint (checkpoint 2) covers only 11 of 17 records: records 11-16 are not covered by any signature",
		firstBad: 11,
	}, {
		name: "replace the last checkpoint with the first",
		tamper: func(t *testing.T, dir string) {
			lines := readLines(t, cpPath(dir))
			lines[3] = lines[0]
			writeLines(t, cpPath(dir), lines)
		},
		want:     "checkpoint 4: size 1 is smaller than checkpoint 3's 16: an older checkpoint was put in place of a newer one",
		firstBad: 1,
	}, {
		name: "re-sign with another key",
		tamper: func(t *testing.T, dir string) {
			lines := readLines(t, cpPath(dir))
			for i, line := range lines {
				var cl checkpointLine
				if err := json.Unmarshal([]byte(line), &cl); err != nil {
					t.Fatal(err)
				}
				text := cl.Note[:strings.Index(cl.Note, "\n\n")+1]
				msg, err := note.Sign(&note.Note{Text: text}, other.Signer())
				if err != nil {
					t.Fatal(err)
				}
				lines[i] = string(encodeCheckpointLine(Checkpoint{Note: string(msg)}))
			}
			writeLines(t, cpPath(dir), lines)
		},
		want:     fmt.Sprintf("checkpoint 1: not signed by key %s+%08x (signed by %s+%08x)", KeyName, k.Verifier().KeyHash(), KeyName, other.Verifier().KeyHash()),
		firstBad: 0, // nothing is vouched for
	}, {
		name: "rewrite a record and the chain after it",
		tamper: func(t *testing.T, dir string) {
			// A careful forger recomputes every hash and prev; only the
			// signed tree roots catch it.
			recs, err := Read(dir, Filter{})
			if err != nil {
				t.Fatal(err)
			}
			recs[12].Fields["n"] = 1200
			var buf, hb []byte
			var prev tlog.Hash
			for i := range recs {
				recs[i].Prev = prev
				enc, _ := encodeFields(recs[i].Fields)
				buf = encodeRecord(buf, &recs[i], enc, &hb)
				prev = recs[i].Hash
			}
			if err := os.WriteFile(recPath(dir), buf, 0o600); err != nil {
				t.Fatal(err)
			}
		},
		want:     "checkpoint 3 (size 16): tree root does not match the records: a record in seq 11-15 was changed, removed or inserted after it was signed",
		firstBad: 11,
	}, {
		name: "checkpoint from another log of the same sandbox",
		tamper: func(t *testing.T, dir string) {
			dir2 := t.TempDir()
			makeLog(t, dir2, k)
			lines := readLines(t, cpPath(dir))
			lines2 := readLines(t, cpPath(dir2))
			lines[3] = lines2[3]
			writeLines(t, cpPath(dir), lines)
		},
		want:     "checkpoint 4: origin",
		firstBad: -1,
	}, {
		name: "edit a checkpoint's text",
		tamper: func(t *testing.T, dir string) {
			lines := readLines(t, cpPath(dir))
			var cl checkpointLine
			_ = json.Unmarshal([]byte(lines[2]), &cl)
			cl.Note = strings.Replace(cl.Note, "\n16\n", "\n15\n", 1)
			b, _ := json.Marshal(cl)
			lines[2] = string(b) + "\n"
			writeLines(t, cpPath(dir), lines)
		},
		want:     "checkpoint 3: bad signature",
		firstBad: -1,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			makeLog(t, dir, k)
			tt.tamper(t, dir)
			rep := mustVerify(t, dir, k.Verifier())
			if rep.OK() {
				t.Fatalf("tampering not detected:\n%s", rep)
			}
			if !strings.Contains(rep.Problems[0], tt.want) {
				t.Errorf("first problem:\n  %s\nwant it to contain\n  %s\nreport:\n%s", rep.Problems[0], tt.want, rep)
			}
			if tt.name == "checkpoint from another log of the same sandbox" {
				// The other log's checkpoint also does not match the tree.
				tt.firstBad = rep.FirstBad
			}
			if rep.FirstBad != tt.firstBad {
				t.Errorf("FirstBad = %d, want %d\n%s", rep.FirstBad, tt.firstBad, rep)
			}
			if err := rep.Err(); !errors.Is(err, errdefs.ErrFailed) || !strings.Contains(err.Error(), "audit: verify dev: ") {
				t.Errorf("Err() = %v", err)
			}
			t.Logf("\n%s", rep)
			// A damaged log is not appended to.
			if l, err := Open(dir, "dev", k.Signer()); err == nil {
				l.Close()
				if !strings.Contains(tt.name, "checkpoint") && !strings.Contains(tt.name, "sign") {
					t.Errorf("Open accepted a log whose records were tampered with")
				}
			}
		})
	}
}

// TestCrash kills a writer with SIGKILL in the middle of an append (a torn
// last line on disk) and checks that reopening repairs the tail without
// losing any acknowledged record.
func TestCrash(t *testing.T) {
	if dir := os.Getenv("AUDIT_CRASH_CHILD"); dir != "" {
		crashChild(dir)
		return
	}
	keyDir := t.TempDir()
	k, err := LoadOrCreateKey(keyDir)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrash$")
	cmd.Env = append(os.Environ(), "AUDIT_CRASH_CHILD="+dir, "AUDIT_CRASH_KEY="+keyDir)
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); !ok || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child: %v\n%s", err, out)
	}
	acked := map[int64]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "acked" {
			seq, _ := strconv.ParseInt(f[1], 10, 64)
			acked[seq] = f[2]
		}
	}
	if len(acked) < 100 {
		t.Fatalf("child acknowledged only %d records:\n%s", len(acked), out)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, recordsFile))
	if bytes.HasSuffix(raw, []byte("\n")) {
		t.Fatal("the child left no torn line")
	}
	rep := mustVerify(t, dir, k.Verifier())
	if !rep.OK() || rep.Closed || rep.Uncovered == 0 || !strings.Contains(strings.Join(rep.Notes, "\n"), "torn line") {
		t.Fatalf("before repair:\n%s", rep)
	}

	l, err := Open(dir, "dev", k.Signer())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rep = mustVerify(t, dir, k.Verifier())
	if !rep.OK() || !rep.Closed || rep.Uncovered != 0 || len(rep.Unverified) != 1 || rep.Unverified[0].Marked < 0 {
		t.Fatalf("after repair:\n%s", rep)
	}
	recs, err := Read(dir, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if h, ok := acked[r.Seq]; ok && h != b64(r.Hash) {
			t.Errorf("seq %d: hash changed", r.Seq)
		}
		delete(acked, r.Seq)
	}
	if len(acked) > 0 {
		t.Errorf("%d acknowledged records lost", len(acked))
	}
	open, mark := recs[len(recs)-3], recs[len(recs)-2]
	if mark.Kind != KindLogUnverified || rep.Unverified[0].From != 1 || rep.Unverified[0].To != open.Seq-1 {
		t.Errorf("the tail the crash left is not marked unverified: %+v, %+v", mark, rep.Unverified)
	}
	if open.Kind != KindLogOpen || open.Fields["clean"] != false || open.Fields["repaired_bytes"] == json.Number("0") {
		t.Errorf("log.open after a crash: %+v", open)
	}
}

func crashChild(dir string) {
	k, err := LoadOrCreateKey(os.Getenv("AUDIT_CRASH_KEY"))
	if err != nil {
		panic(err)
	}
	l, err := Open(dir, "dev", k.Signer())
	if err != nil {
		panic(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				r, err := l.Append(context.Background(), KindNetFlow, map[string]any{"g": g, "i": i})
				if err != nil {
					panic(err)
				}
				mu.Lock()
				fmt.Printf("acked %d %s\n", r.Seq, b64(r.Hash))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// The torn start of a next batch, as a crash inside write(2) leaves it.
	f, _ := os.OpenFile(filepath.Join(dir, recordsFile), os.O_WRONLY|os.O_APPEND, 0)
	f.WriteString(`{"seq":201,"time":"2026-03-01T12:00:00Z","sandbox":"dev","kind":"net.fl`)
	f.Sync()
	os.Stdout.Sync()
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}

func TestConcurrentAppends(t *testing.T) {
	k := testKey(t)
	dir := t.TempDir()
	l, err := Open(dir, "dev", k.Signer())
	if err != nil {
		t.Fatal(err)
	}
	const G, N = 8, 300
	var wg sync.WaitGroup
	seqs := make(chan int64, G*N)
	for g := range G {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range N {
				r, err := l.Append(context.Background(), KindNetFlow, map[string]any{"g": g, "i": i})
				if err != nil {
					t.Error(err)
					return
				}
				seqs <- r.Seq
			}
		}()
	}
	wg.Wait()
	close(seqs)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for s := range seqs {
		if seen[s] || s < 1 || s > G*N {
			t.Fatalf("seq %d handed out twice or out of range", s)
		}
		seen[s] = true
	}
	rep := mustVerify(t, dir, k.Verifier())
	if !rep.OK() || rep.Records != G*N+2 {
		t.Fatalf("%s", rep)
	}
	t.Logf("%d records in %d fsyncs", G*N+2, l.syncs.Load())
}

func TestFollow(t *testing.T) {
	old := FollowInterval
	FollowInterval = 10 * time.Millisecond
	defer func() { FollowInterval = old }()
	k := testKey(t)
	dir := t.TempDir()
	l, err := Open(dir, "dev", k.Signer())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan Record, 100)
	done := make(chan error, 1)
	go func() {
		done <- Follow(ctx, dir, Filter{Refusals: true}, func(r Record) error { got <- r; return nil })
	}()
	for i := range 5 {
		if _, err := l.Append(ctx, KindExecStart, map[string]any{"i": i}); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(ctx, KindFileRefused, map[string]any{"path": fmt.Sprintf("/etc/%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		select {
		case r := <-got:
			if r.Kind != KindFileRefused || r.Fields["path"] != fmt.Sprintf("/etc/%d", i) {
				t.Fatalf("record %d: %+v", i, r)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("follow saw %d records", i)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestOpenIsExclusiveAndPrune(t *testing.T) {
	k := testKey(t)
	root := t.TempDir()
	dir := Dir(root, "dev")
	l, err := Open(dir, "dev", k.Signer())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, "dev", k.Signer()); !errors.Is(err, errdefs.ErrInUse) {
		t.Errorf("second writer: %v", err)
	}
	if err := Prune(root, "dev"); !errors.Is(err, errdefs.ErrInUse) {
		t.Errorf("prune while open: %v", err)
	}
	if _, err := Open(Dir(root, "other"), "dev", k.Signer()); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := Open(dir, "prod", k.Signer()); !errors.Is(err, errdefs.ErrFailed) {
		t.Errorf("opened dev's log as prod's: %v", err)
	}
	names, err := List(root)
	if err != nil || strings.Join(names, ",") != "dev,other" {
		t.Errorf("List = %v, %v", names, err)
	}
	if err := Prune(root, "dev"); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir, Filter{}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("read after prune: %v", err)
	}
	if err := Prune(root, "dev"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second prune: %v", err)
	}
}

func TestKeyFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	k1, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadOrCreateKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if k1.PublicKey() != k2.PublicKey() || !strings.HasPrefix(k1.PublicKey(), KeyName+"+") {
		t.Fatalf("keys differ: %s %s", k1.PublicKey(), k2.PublicKey())
	}
	for name, want := range map[string]os.FileMode{".": 0o700, "key": 0o600} {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", name, st.Mode().Perm(), want)
		}
	}
	pub, err := os.ReadFile(filepath.Join(dir, "key.pub"))
	if err != nil || strings.TrimSpace(string(pub)) != k1.PublicKey() {
		t.Errorf("key.pub = %q, %v", pub, err)
	}
	v, err := ParseVerifier(k1.PublicKey())
	if err != nil || v.KeyHash() != k1.Verifier().KeyHash() {
		t.Errorf("ParseVerifier: %v", err)
	}
}

// TestVector verifies the committed log in testdata/v1, so a change to the
// record or checkpoint format that breaks old logs fails here. Regenerate
// (only for a deliberate format change, with a new vN) with -update.
func TestVector(t *testing.T) {
	dir := filepath.Join("testdata", "v1")
	if *update {
		k := testKey(t)
		os.RemoveAll(dir)
		makeLog(t, dir, k)
		os.Remove(filepath.Join(dir, lockFile))
		if err := os.WriteFile(filepath.Join(dir, "key.pub"), []byte(k.PublicKey()+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pub, err := os.ReadFile(filepath.Join(dir, "key.pub"))
	if err != nil {
		t.Fatal(err)
	}
	v, err := ParseVerifier(string(pub))
	if err != nil {
		t.Fatal(err)
	}
	rep := mustVerify(t, dir, v)
	if !rep.OK() || rep.Records != 17 || rep.Checkpoints != 4 || !rep.Closed {
		t.Fatalf("%s", rep)
	}
	recs, err := Read(dir, Filter{Refusals: true})
	if err != nil || len(recs) != 1 || recs[0].Seq != 3 || recs[0].Kind != KindNetRefused {
		t.Fatalf("refusals: %+v %v", recs, err)
	}
}
