package guest

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/smx-dev/smx/internal/agentproto"
)

// A command that cannot start carries the exit status a shell would give:
// 127 not found, 126 not executable (as docker run does).
func TestExecStartFailureExitCodes(t *testing.T) {
	sess := startServer(t)
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("not a program\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte{0x7f, 'E', 'L', 'F', 0, 1, 2}, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want int
	}{
		{[]string{"no-such-program"}, 127},
		{[]string{filepath.Join(dir, "missing")}, 127},
		{[]string{plain}, 126},
		{[]string{dir}, 126},
		{[]string{garbage}, 126},
		{[]string{"sh", "-c", "exit 3"}, 0},
	} {
		r := run(t, sess, agentproto.ExecRequest{Args: tt.args}, nil)
		if tt.want == 0 {
			mustExit(t, r, 3)
			continue
		}
		var pe *agentproto.Error
		if !errors.As(r.Err, &pe) || pe.ExitCode != tt.want {
			t.Errorf("%v: error %#v, want exit code %d", tt.args, r.Err, tt.want)
		}
	}
}
