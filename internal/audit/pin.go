package audit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/statedir"
)

// A key kept only in the state directory proves nothing against someone who
// can write that directory: they can re-sign a rewritten log with a key of
// their own and put its public half beside it. So the public key is also
// pinned outside the state directory, in the user's configuration, when
// the key is created (trust on first use), and verification checks the
// state directory's key against the pin.
//
// The trusted keys file has one line per key directory:
//
//	<absolute key directory> <note verifier key>
//
// Lines starting with '#' and blank lines are ignored.

// TrustedKeysFile is where keys are pinned: $XDG_CONFIG_HOME/smx/trusted-log-keys,
// by default ~/.config/smx/trusted-log-keys.
func TrustedKeysFile() (string, error) {
	d, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("audit: trusted keys: %v: %w", err, errdefs.ErrUnavailable)
	}
	return filepath.Join(d, "smx", "trusted-log-keys"), nil
}

// Pinned returns the key pinned for keyDir in file, or "" when none is.
func Pinned(file, keyDir string) (string, error) {
	dir, err := filepath.Abs(keyDir)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("audit: trusted keys: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i > 0 && strings.TrimSpace(line[:i]) == dir {
			return line[i+1:], nil
		}
	}
	return "", nil
}

// Pin records vkey as the key of keyDir in file. It reports whether it added
// the pin; pinning the key already pinned is not an error, pinning another
// fails with errdefs.ErrDenied (a pin is changed by editing the file, which
// is the point).
func Pin(file, keyDir, vkey string) (bool, error) {
	dir, err := filepath.Abs(keyDir)
	if err != nil {
		return false, err
	}
	if strings.ContainsAny(dir, "\n") {
		return false, fmt.Errorf("audit: pin: key directory %q: %w", dir, errdefs.ErrInvalid)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return false, fmt.Errorf("audit: pin: %w", err)
	}
	lock, err := statedir.LockFile(file + ".lock")
	if err != nil {
		return false, err
	}
	defer lock.Unlock()
	have, err := Pinned(file, dir)
	if err != nil {
		return false, err
	}
	switch have {
	case vkey:
		return false, nil
	case "":
	default:
		return false, fmt.Errorf("audit: pin: %s already pins another key for %s (%s): %w", file, dir, have, errdefs.ErrDenied)
	}
	old, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("audit: pin: %w", err)
	}
	if len(old) == 0 {
		old = []byte("# smx audit log keys, pinned at first use: <state dir key directory> <public key>\n")
	} else if !bytes.HasSuffix(old, []byte("\n")) {
		old = append(old, '\n')
	}
	old = fmt.Appendf(old, "%s %s\n", dir, vkey)
	if err := statedir.WriteFileAtomic(file, old, 0o600); err != nil {
		return false, fmt.Errorf("audit: pin: %w", err)
	}
	return true, nil
}

// LoadOrCreatePinnedKey is LoadOrCreateKey for a state directory's key: a
// key it creates is pinned in TrustedKeysFile at once. Failing to pin does
// not fail (logs must still be written); verification then warns that the
// key is not pinned.
func LoadOrCreatePinnedKey(dir string) (*Key, error) {
	k, err := LoadOrCreateKey(dir)
	if err != nil || !k.created {
		return k, err
	}
	if file, err := TrustedKeysFile(); err == nil {
		_, _ = Pin(file, dir, k.public)
	}
	return k, nil
}
