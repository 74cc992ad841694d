package supervisor

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/smx-dev/smx/internal/statedir"
)

// TestBootNamesFailingStep: a boot that fails names the step it failed
// in, and the trace has a line for the step; no later step runs.
func TestBootNamesFailingStep(t *testing.T) {
	var logged bytes.Buffer
	s := &Supervisor{
		opts: Options{State: statedir.Dir{Root: t.TempDir()}}, // no kernel cached
		log:  slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	err := s.boot(context.Background())
	if err == nil || !strings.HasPrefix(err.Error(), "boot: kernel: ") {
		t.Fatalf("boot without a kernel: err = %v, want it to name the step kernel", err)
	}
	out := logged.String()
	if !strings.Contains(out, `msg="boot step" step=kernel took=`) {
		t.Errorf("no trace line for the kernel step:\n%s", out)
	}
	if strings.Contains(out, "step=initramfs") {
		t.Errorf("a step ran after the failing one:\n%s", out)
	}
}
