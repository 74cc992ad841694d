package sandbox

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Duration is a time.Duration written in JSON as Go writes durations
// ("10m0s"), so spec.json and `smx agent inspect` read as the user typed.
type Duration time.Duration

// String is Go's form without its trailing zero units: 10m, 1h30m, 45s.
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// ParseLimit reads the value of a sandbox limit flag (--timeout,
// --idle-stop): empty is no limit; anything else is a Go duration of at
// least a second (10m, 1h30m, 45s).
func ParseLimit(flag, s string) (Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second {
		return 0, fmt.Errorf("invalid %s %q: give a duration of at least 1s, such as 45s, 10m or 2h: %w", flag, s, errdefs.ErrInvalid)
	}
	return Duration(d), nil
}
