package sandbox

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/smx-dev/smx/internal/errdefs"
)

func TestParseLimit(t *testing.T) {
	for in, want := range map[string]string{"": "0s", "45s": "45s", "10m": "10m", "1h30m": "1h30m", "2h": "2h", "90m": "1h30m", "1.5s": "1.5s"} {
		d, err := ParseLimit("--timeout", in)
		if err != nil || d.String() != want {
			t.Errorf("ParseLimit(%q) = %v, %v; want %s", in, d, err, want)
		}
		b, _ := json.Marshal(d)
		var back Duration
		if err := json.Unmarshal(b, &back); err != nil || back != d {
			t.Errorf("%q: JSON %s read back as %v, %v", in, b, back, err)
		}
	}
	for _, in := range []string{"10", "soon", "0s", "-5m", "500ms", "1d"} {
		if _, err := ParseLimit("--idle-stop", in); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ParseLimit(%q): %v, want invalid", in, err)
		}
	}
	if d, _ := ParseLimit("--timeout", "1h"); time.Duration(d) != time.Hour {
		t.Errorf("1h = %v", time.Duration(d))
	}
}
