package virtiofs

import (
	"testing"
)

// BenchmarkLookupGetattr is the backend's share of a guest's lstat with
// entry and attribute timeouts of 0 (what `git status` sends per file):
// LOOKUP of the directory, LOOKUP of the file, GETATTR of the file.
func BenchmarkLookupGetattr(b *testing.B) {
	e := newEnv(b)
	for i := 0; i < b.N; i++ {
		dir, errno := e.lookup(rootID, "src")
		if errno != 0 {
			b.Fatal(errno)
		}
		f, errno := e.lookup(dir, "a.go")
		if errno != 0 {
			b.Fatal(errno)
		}
		if _, errno := e.call(opGetattr, f, make([]byte, 16), nil, 256); errno != 0 {
			b.Fatal(errno)
		}
	}
}
