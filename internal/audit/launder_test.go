package audit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

// forge appends records of the given kinds to the closed log in dir the way
// someone who can write the file but not sign would: seq, prev and hash all
// computed correctly, so only the log's structure and signatures can tell.
func forge(t *testing.T, dir string, kinds ...string) {
	t.Helper()
	recs, err := Read(dir, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	last := recs[len(recs)-1]
	var buf, hb []byte
	prev, seq := last.Hash, last.Seq+1
	for _, k := range kinds {
		r := Record{Seq: seq, Time: last.Time.Add(time.Second), Sandbox: last.Sandbox, Kind: k, Prev: prev}
		enc, _ := encodeFields(map[string]any{"args": []string{"curl", "evil.example"}})
		buf = encodeRecord(buf, &r, enc, &hb)
		prev, seq = r.Hash, seq+1
	}
	f, err := os.OpenFile(filepath.Join(dir, recordsFile), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(buf); err != nil {
		t.Fatal(err)
	}
}

// A record appended after log.close, with a correct chain hash, fails
// verification, and no writer reopens the log to sign over it.
func TestForgedTailAfterClose(t *testing.T) {
	k := testKey(t)
	dir := t.TempDir()
	makeLog(t, dir, k)
	forge(t, dir, KindExecStart)

	rep := mustVerify(t, dir, k.Verifier())
	if rep.OK() {
		t.Fatalf("a record after log.close verified:\n%s", rep)
	}
	want := "seq 17: exec.start record after log.close (seq 16) without log.open: the log's writer did not write it"
	if rep.Problems[0] != want || rep.FirstBad != 17 {
		t.Fatalf("problem %q, FirstBad %d; want %q, 17\n%s", rep.Problems[0], rep.FirstBad, want, rep)
	}
	l, err := Open(dir, "dev", k.Signer())
	if err == nil {
		l.Close()
		t.Fatal("Open accepted a log with a record after log.close")
	}
	if !errors.Is(err, errdefs.ErrFailed) || !strings.Contains(err.Error(), "without log.open") {
		t.Fatalf("Open: %v", err)
	}
	if rep := mustVerify(t, dir, k.Verifier()); rep.OK() || rep.Records != 18 {
		t.Fatalf("the failed Open changed the log:\n%s", rep)
	}
}

// A forger who also fakes the log.open (so the tail looks like a writer
// that crashed) gets the tail kept but never vouched for: the next writer
// marks it unverified before it signs anything, and Verify says so however
// many checkpoints follow.
func TestForgedTailThenRestart(t *testing.T) {
	k := testKey(t)
	dir := t.TempDir()
	makeLog(t, dir, k)
	forge(t, dir, KindLogOpen, KindExecStart)

	rep := mustVerify(t, dir, k.Verifier())
	if !rep.OK() || rep.Uncovered != 2 || len(rep.Unverified) != 0 {
		t.Fatalf("before the restart:\n%s", rep)
	}

	l, err := OpenWith(dir, "dev", Options{Signer: k.Signer(), Now: fakeClock(t0.Add(time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Checkpoint(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	recs, err := Read(dir, Filter{From: 19})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[0].Kind != KindLogOpen || recs[0].Fields["clean"] != false ||
		recs[1].Kind != KindLogUnverified || recs[1].Fields["from"].(interface{ String() string }).String() != "17" ||
		recs[1].Fields["to"].(interface{ String() string }).String() != "18" || recs[2].Kind != KindLogClose {
		t.Fatalf("records after the restart: %+v", recs)
	}

	rep = mustVerify(t, dir, k.Verifier())
	if !rep.OK() || !rep.Closed || rep.Uncovered != 0 {
		t.Fatalf("after the restart:\n%s", rep)
	}
	if len(rep.Unverified) != 1 || rep.Unverified[0] != (Span{From: 17, To: 18, Marked: 20}) {
		t.Fatalf("Unverified = %+v, want records 17-18 marked at 20\n%s", rep.Unverified, rep)
	}
	s := rep.String()
	if !strings.Contains(s, "; 2 unverified\n") || !strings.Contains(s, "unverified: records 17-18: written after the last checkpoint") {
		t.Fatalf("report does not say the tail is unverified:\n%s", s)
	}
	t.Logf("\n%s", s)
}

// A tail no checkpoint covered when an older writer (one that did not mark
// it) reopened the log is still reported unverified: Verify works it out
// from the checkpoints, not from the marker.
func TestUnmarkedUncoveredTail(t *testing.T) {
	k := testKey(t)
	dir := t.TempDir()
	makeLog(t, dir, k)
	forge(t, dir, KindLogOpen, KindExecStart, KindLogOpen)
	// Sign over it as a writer that does not mark would have.
	l, err := OpenWith(dir, "dev", Options{Signer: k.Signer(), Now: fakeClock(t0.Add(time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	rep := mustVerify(t, dir, k.Verifier())
	if !rep.OK() || len(rep.Unverified) < 1 || rep.Unverified[0] != (Span{From: 17, To: 18, Marked: -1}) {
		t.Fatalf("Unverified = %+v\n%s", rep.Unverified, rep)
	}
	if !strings.Contains(rep.String(), "not marked") {
		t.Fatalf("report:\n%s", rep)
	}
}

// The public key is pinned outside the state directory when the key is
// created, and a pin is never silently replaced.
func TestPinnedKey(t *testing.T) {
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	file, err := TrustedKeysFile()
	if err != nil || file != filepath.Join(cfg, "smx", "trusted-log-keys") {
		t.Fatalf("TrustedKeysFile = %q, %v", file, err)
	}
	keyDir := filepath.Join(t.TempDir(), "audit")
	k, err := LoadOrCreatePinnedKey(keyDir)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := Pinned(file, keyDir); err != nil || got != k.PublicKey() {
		t.Fatalf("Pinned = %q, %v; want %q", got, err, k.PublicKey())
	}
	st, err := os.Stat(file)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("trusted keys file: %v %v", st, err)
	}

	// An intruder replaces the key in the state directory.
	os.Remove(filepath.Join(keyDir, "key"))
	k2, err := LoadOrCreatePinnedKey(keyDir)
	if err != nil {
		t.Fatal(err)
	}
	if k2.PublicKey() == k.PublicKey() {
		t.Fatal("no new key")
	}
	if got, _ := Pinned(file, keyDir); got != k.PublicKey() {
		t.Fatalf("the pin followed the replaced key: %q", got)
	}
	if added, err := Pin(file, keyDir, k2.PublicKey()); added || !errors.Is(err, errdefs.ErrDenied) {
		t.Fatalf("Pin of another key: %v, %v", added, err)
	}
	if added, err := Pin(file, keyDir, k.PublicKey()); added || err != nil {
		t.Fatalf("Pin of the pinned key: %v, %v", added, err)
	}
	// Another state directory gets its own pin.
	other := filepath.Join(t.TempDir(), "audit")
	k3, err := LoadOrCreatePinnedKey(other)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := Pinned(file, other); got != k3.PublicKey() {
		t.Fatalf("second state dir: pinned %q", got)
	}
	if got, _ := Pinned(file, keyDir); got != k.PublicKey() {
		t.Fatalf("first pin lost: %q", got)
	}
}

func TestCountRefusals(t *testing.T) {
	k := testKey(t)
	dir := t.TempDir()
	l, err := Open(dir, "dev", k.Signer())
	if err != nil {
		t.Fatal(err)
	}
	for _, rec := range []struct {
		kind   string
		fields map[string]any
	}{
		{KindNetRefused, map[string]any{"host": "evil.example"}},
		{KindNetFlow, map[string]any{"host": "ok.example"}},
		{"net.events_lost", map[string]any{"lost": 3, "refused": true}},
		{KindExecStart, map[string]any{"args": []string{`"refused":true`}}},
		{KindExecStart, map[string]any{"nested": map[string]any{"refused": true}}},
		{KindGitRefused, nil},
	} {
		if _, err := l.Append(t.Context(), rec.kind, rec.fields); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	n, err := CountRefusals(dir, Identity{})
	want, _ := Read(dir, Filter{Refusals: true})
	if err != nil || n != int64(len(want)) || n != 3 {
		t.Fatalf("CountRefusals = %d, %v; Read finds %d, want 3", n, err, len(want))
	}
}

// A log outlives its sandbox and a name is reused: what a sandbox is shown
// of itself (ls's count, smx-why) begins at its own sandbox.create, told
// by its ID, and a log begun after it was created is all its own; a
// sandbox without an ID is told by time.
func TestOwnRefusals(t *testing.T) {
	k := testKey(t)
	dir := t.TempDir()
	appendAll := func(recs ...[2]any) {
		t.Helper()
		l, err := Open(dir, "x", k.Signer())
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for _, r := range recs {
			f, _ := r[1].(map[string]any)
			if _, err := l.Append(t.Context(), r[0].(string), f); err != nil {
				t.Fatal(err)
			}
		}
	}
	old := Identity{ID: "aaaa", Created: time.Now()}
	appendAll([2]any{KindSandboxCreate, map[string]any{"sandbox_id": old.ID}},
		[2]any{KindNetRefused, map[string]any{"host": "old.example"}},
		[2]any{KindNetFlow, map[string]any{"lost": 1, "refused": true}},
		[2]any{KindSandboxRemove, nil})
	time.Sleep(2 * time.Millisecond)
	cur := Identity{ID: "bbbb", Created: time.Now()}
	count := func(id Identity) int64 {
		t.Helper()
		n, err := CountRefusals(dir, id)
		recs, rerr := Read(dir, Filter{Refusals: true, Sandbox: id})
		if err != nil || rerr != nil || n != int64(len(recs)) {
			t.Fatalf("CountRefusals = %d, %v; Read finds %d, %v", n, err, len(recs), rerr)
		}
		return n
	}
	// Created, its sandbox.create not yet written (smx run's supervisor
	// writes it as it opens the log): nothing is its own yet.
	if n := count(cur); n != 0 {
		t.Fatalf("the new sandbox is shown %d refusals of the one removed before it", n)
	}
	if n := count(Identity{}); n != 2 {
		t.Fatalf("the whole log has %d refusals, want 2", n)
	}
	appendAll([2]any{KindSandboxCreate, map[string]any{"sandbox_id": cur.ID}},
		[2]any{KindExecStart, map[string]any{"args": []string{"true"}}})
	if n := count(cur); n != 0 {
		t.Fatalf("after its create: %d refusals, want 0", n)
	}
	appendAll([2]any{KindGitRefused, map[string]any{"repo": "new"}},
		[2]any{"net.events_lost", map[string]any{"lost": 3, "refused": true}})
	if n := count(cur); n != 2 {
		t.Fatalf("its own refusals: %d, want 2", n)
	}
	recs, _ := Read(dir, Filter{Refusals: true, Sandbox: cur})
	if recs[0].Fields["repo"] != "new" {
		t.Fatalf("first own refusal: %+v", recs[0])
	}
	// Without an ID (made before IDs were kept): records since it was created.
	if n := count(Identity{Created: cur.Created}); n != 2 {
		t.Fatalf("by time: %d, want 2", n)
	}
	// A log begun after the sandbox was created (pruned) is all its own.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	appendAll([2]any{KindFileRefused, map[string]any{"path": "/work/.env"}})
	if n := count(cur); n != 1 {
		t.Fatalf("after a prune: %d, want 1", n)
	}
}
