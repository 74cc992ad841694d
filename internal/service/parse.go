package service

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/smx-dev/smx/internal/errdefs"
)

var sizeRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9]+)([KkMmGgTt]?)(i?[Bb])?$`) })

// ParseSize reads "512M", "1G", "4GiB", "1048576" as bytes.
func ParseSize(s string) (int64, error) {
	m := sizeRE().FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("invalid size %q: use a number with an optional K, M, G or T suffix, e.g. 512M or 2G: %w", s, errdefs.ErrInvalid)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q: %w", s, errdefs.ErrInvalid)
	}
	shift := map[string]uint{"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[strings.ToLower(m[2])]
	if n > (1<<62)>>shift {
		return 0, fmt.Errorf("invalid size %q: too large: %w", s, errdefs.ErrInvalid)
	}
	return n << shift, nil
}

var envKeyRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`) })

// ParseEnv checks KEY=VALUE entries. A bare "KEY" takes KEY from this
// process's environment, as docker does (and is dropped when unset).
func ParseEnv(vals []string) ([]string, error) {
	var out []string
	for _, v := range vals {
		k, val, ok := strings.Cut(v, "=")
		if !envKeyRE().MatchString(k) {
			return nil, fmt.Errorf("invalid environment variable %q: want KEY=VALUE with KEY of letters, digits and _: %w", v, errdefs.ErrInvalid)
		}
		if !ok {
			hv, found := os.LookupEnv(k)
			if !found {
				continue
			}
			val = hv
		}
		out = append(out, k+"="+val)
	}
	return out, nil
}

// HumanBytes is n in KiB, MiB, ... with one decimal.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
