package audit

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/mod/sumdb/note"
)

func newSigner(t *testing.T) (note.Signer, string) {
	skey, vkey, err := note.GenerateKey(rand.Reader, KeyName)
	if err != nil {
		t.Fatal(err)
	}
	s, err := note.NewSigner(skey)
	if err != nil {
		t.Fatal(err)
	}
	return s, vkey
}

// TestBundlesProveTheChainAcrossAMove: a sandbox's log on host A records a
// snapshot; the sandbox restored from it on host B begins its log with a
// link to that record. The two exported bundles verify as one chain, and
// each way of breaking it is named.
func TestBundlesProveTheChainAcrossAMove(t *testing.T) {
	ctx := context.Background()
	sa, ka := newSigner(t)
	sb, kb := newSigner(t)
	dirA, dirB := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	la, err := Open(dirA, "agent1", sa)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := la.Append(ctx, KindSnapshotCreate, map[string]any{"snapshot": "s1"})
	if err != nil {
		t.Fatal(err)
	}
	la.Close()
	link := func(hash string) string {
		dir := filepath.Join(t.TempDir(), "b")
		lb, err := Open(dir, "moved", sb)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := lb.Append(ctx, KindSandboxCreate, map[string]any{"origin_log_sandbox": "agent1", "origin_log_id": la.ID(),
			"origin_log_seq": rec.Seq, "origin_log_hash": hash}); err != nil {
			t.Fatal(err)
		}
		lb.Close()
		return dir
	}
	dirB = link(b64(rec.Hash))
	export := func(dir, key string) string {
		f, err := os.CreateTemp(t.TempDir(), "bundle-*.tar")
		if err != nil {
			t.Fatal(err)
		}
		if err := ExportBundle(f, dir, key); err != nil {
			t.Fatal(err)
		}
		f.Close()
		return f.Name()
	}
	ba, bb := export(dirA, ka), export(dirB, kb)
	reps, err := VerifyBundles([]string{ba, bb}, []string{ka, kb})
	if err != nil {
		t.Fatal(err)
	}
	if len(reps[1].Links) != 1 || !reps[1].Links[0].Verified {
		t.Fatalf("links %+v", reps[1].Links)
	}

	for _, tc := range []struct {
		name    string
		files   []string
		trusted []string
		want    string
	}{
		{"the old log missing", []string{bb}, []string{ka, kb}, "is not among the bundles given"},
		{"the old host's key not trusted", []string{ba, bb}, []string{kb}, "not covered by a verified checkpoint of a trusted key"},
		{"a link to another record", []string{ba, export(link(b64(rec.Prev)), kb)}, []string{ka, kb}, "the link names"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := VerifyBundles(tc.files, tc.trusted)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("VerifyBundles: %v; want %q", err, tc.want)
			}
		})
	}
}
