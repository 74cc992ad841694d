package fsgw

import (
	"strings"
	"testing"

	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// WalkGetAttr answers what Walk then GetAttr answer, and refuses what
// Walk refuses, with the walk's record.
func TestWalkGetAttr(t *testing.T) {
	e := newEnv(t, testProfile, false)
	qids, f, _, attr, err := e.root.WalkGetAttr([]string{"src", "a.go"})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	q, _, want, err := e.mustWalk("src/a.go").GetAttr(p9.AttrMaskAll)
	if err != nil {
		t.Fatal(err)
	}
	if len(qids) != 2 || qids[1] != q || attr != want {
		t.Fatalf("WalkGetAttr: %v %+v, Walk+GetAttr: %v %+v", qids, attr, q, want)
	}
	if attr.Size != uint64(len("package a\n")) {
		t.Fatalf("size %d", attr.Size)
	}
	_, _, _, _, err = e.root.WalkGetAttr([]string{".env"})
	wantErr(t, "walkgetattr .env", err, unix.ENOENT)
	if r := e.refusal("walk", "/work/.env"); !strings.Contains(r["rule"].(string), "files.rules[1]") {
		t.Fatalf("refusal rule %q", r["rule"])
	}
	_, _, _, _, err = e.root.WalkGetAttr([]string{"src", "keys", "k.pem"})
	wantErr(t, "walkgetattr src/keys/k.pem", err, unix.ENOENT)
}
