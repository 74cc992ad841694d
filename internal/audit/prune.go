package audit

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/statedir"
)

// Prune deletes the log of sandbox under root (what `smx logs prune` does;
// removing a sandbox never does). It fails with errdefs.ErrInUse while a
// writer has the log open and errdefs.ErrNotFound when there is no log. The
// directory is renamed aside first, so readers see the whole log or none.
func Prune(root, sandbox string) error {
	if !validName(sandbox) {
		return fmt.Errorf("audit: prune: invalid sandbox name %q: %w", sandbox, errdefs.ErrInvalid)
	}
	dir := Dir(root, sandbox)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("audit: prune %s: no log: %w", sandbox, errdefs.ErrNotFound)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return fmt.Errorf("audit: prune %s: %w", sandbox, err)
	}
	defer lock.Unlock()
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	tomb := filepath.Join(root, ".prune-"+sandbox+"-"+hex.EncodeToString(suffix))
	if err := os.Rename(dir, tomb); err != nil {
		return fmt.Errorf("audit: prune %s: %w", sandbox, err)
	}
	statedir.SyncDir(root)
	if err := os.RemoveAll(tomb); err != nil {
		return fmt.Errorf("audit: prune %s: %w", sandbox, err)
	}
	return nil
}

// List names the sandboxes that have a log under root, sorted. Leftovers of
// an interrupted Prune are removed on the way.
func List(root string) ([]string, error) {
	ents, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("audit: list: %w", err)
	}
	var names []string
	for _, e := range ents {
		switch {
		case strings.HasPrefix(e.Name(), ".prune-"):
			_ = os.RemoveAll(filepath.Join(root, e.Name()))
		case e.IsDir() && validName(e.Name()):
			if _, err := os.Stat(filepath.Join(root, e.Name(), recordsFile)); err == nil {
				names = append(names, e.Name())
			}
		}
	}
	sort.Strings(names)
	return names, nil
}
