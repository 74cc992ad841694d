//go:build !smxhostile

package guest

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/smx-dev/smx/internal/tarfs"
)

// writeTar archives p (not following a symlink at p itself) with entries
// named under base(p). Hard links within the tree are kept as links.
func writeTar(w io.Writer, p string) error {
	top := filepath.Base(p)
	if top == "/" {
		top = "."
	}
	if err := tarfs.Pack(w, p, top); err != nil {
		return fmt.Errorf("guest: copy-out: %w", err)
	}
	return nil
}
