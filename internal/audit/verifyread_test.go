package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestVerifyRead: the records VerifyRead returns are the log's, decoded
// from the bytes it verified; a changed record makes the report fail.
func TestVerifyRead(t *testing.T) {
	k := testKey(t)
	dir := t.TempDir()
	makeLog(t, dir, k)
	rep, recs, err := VerifyRead(dir, k.Verifier())
	if err != nil || !rep.OK() {
		t.Fatalf("VerifyRead: %v %v", err, rep)
	}
	want, err := Read(dir, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(want) || int64(len(recs)) != rep.Records {
		t.Fatalf("%d records, Read has %d, report %d", len(recs), len(want), rep.Records)
	}
	for i := range recs {
		if recs[i].Seq != want[i].Seq || recs[i].Kind != want[i].Kind || recs[i].Hash != want[i].Hash {
			t.Fatalf("record %d: %+v, Read has %+v", i, recs[i], want[i])
		}
	}
	p := filepath.Join(dir, recordsFile)
	b, _ := os.ReadFile(p)
	os.WriteFile(p, bytes.Replace(b, []byte("evil.example"), []byte("good.example"), 1), 0o600)
	rep, recs, err = VerifyRead(dir, k.Verifier())
	if err != nil || rep.OK() {
		t.Fatalf("a changed record verified: %v %v", err, rep)
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records from a changed log", len(recs))
	}
}
