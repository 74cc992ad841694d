package audit

import (
	"crypto/sha256"

	"golang.org/x/mod/sumdb/tlog"
)

// frontier is the right edge of a tlog Merkle tree: the roots of its
// complete subtrees, largest first. It is all that is needed to append a
// leaf and to compute the tree hash at the current size, so the writer and
// the verifier use O(log n) memory however long the log is. The tree is
// tlog's (RFC 6962): leaves are tlog.RecordHash, interior nodes
// tlog.NodeHash; TestFrontierMatchesTlog checks it against tlog.TreeHash.
type frontier struct {
	n     int64
	nodes []tlog.Hash // nodes[i] covers 2^(bit) leaves for the set bits of n, high to low
}

func (f *frontier) push(leaf tlog.Hash) {
	h := leaf
	// Merge while the lowest subtree is the same size as the new one: one
	// merge per trailing one bit of n.
	for m := f.n; m&1 == 1; m >>= 1 {
		last := len(f.nodes) - 1
		h = tlog.NodeHash(f.nodes[last], h)
		f.nodes = f.nodes[:last]
	}
	f.nodes = append(f.nodes, h)
	f.n++
}

// root is the tree hash at size n (tlog.TreeHash).
func (f *frontier) root() tlog.Hash {
	if len(f.nodes) == 0 {
		return sha256.Sum256(nil) // as tlog.TreeHash(0, ...)
	}
	h := f.nodes[len(f.nodes)-1]
	for i := len(f.nodes) - 2; i >= 0; i-- {
		h = tlog.NodeHash(f.nodes[i], h)
	}
	return h
}
