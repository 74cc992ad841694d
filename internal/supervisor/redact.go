package supervisor

import (
	"os"
	"strings"
	"sync"
	"time"

	"github.com/smx-dev/smx/internal/audit"
	"github.com/smx-dev/smx/internal/creds"
)

// execRedactor removes secrets from a recorded command line: the values
// of the credentials the host holds, then the profile's log.redact
// patterns and the built-in token shapes.
func (s *Supervisor) execRedactor() *audit.Redactor {
	return s.redactor().WithSecrets(s.stored.secrets(creds.Store{Dir: s.opts.State.Creds()}))
}

// storedSecrets keeps the values of the host's credential store compiled
// for redaction (audit.Secrets), in this process's memory only, as the
// gateways read them. They are read again when the store's directory
// changes (every set, login, refresh and removal renames a file in it) and
// at least every storedSecretsTTL, so a change within the directory's
// timestamp granularity is not missed for long.
type storedSecrets struct {
	mu     sync.Mutex
	mtime  time.Time
	loaded time.Time
	sec    *audit.Secrets
}

const storedSecretsTTL = 2 * time.Second

func (c *storedSecrets) secrets(store creds.Store) *audit.Secrets {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := os.Stat(store.Dir)
	if err != nil {
		c.sec, c.mtime = nil, time.Time{}
		return nil
	}
	if c.sec != nil && st.ModTime().Equal(c.mtime) && time.Since(c.loaded) < storedSecretsTTL {
		return c.sec
	}
	c.sec, c.mtime, c.loaded = audit.NewSecrets(storeValues(store)), st.ModTime(), time.Now()
	return c.sec
}

// storeValues reads every value of the store: each secret, and of a
// sign-in's refresh material (NAME.oauth) the refresh token.
func storeValues(store creds.Store) [][]byte {
	infos, err := store.List()
	if err != nil {
		return nil
	}
	var out [][]byte
	for _, in := range infos {
		if base, ok := strings.CutSuffix(in.Name, ".oauth"); ok {
			if o, err := store.OAuthOf(base); err == nil && o.RefreshToken != "" {
				out = append(out, []byte(o.RefreshToken))
			}
			continue
		}
		if v, err := store.Get(in.Name); err == nil {
			out = append(out, v)
		}
	}
	return out
}
