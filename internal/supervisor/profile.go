package supervisor

import (
	"log/slog"
	"os"
	"runtime/pprof"
)

// cpuProfile starts a CPU profile of the supervisor into path
// (SMX_CPUPROFILE, "{name}" in it replaced by the sandbox's; for measuring the gateways and the virtio-fs backend
// under a benchmark) and returns what stops and writes it; nil when it
// cannot start. The profile is complete only when Run returns (a graceful
// stop), not when the supervisor is killed.
func cpuProfile(path string, log *slog.Logger) func() {
	f, err := os.Create(path)
	if err != nil {
		if log != nil {
			log.Warn("cpu profile", "err", err)
		}
		return nil
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		if log != nil {
			log.Warn("cpu profile", "err", err)
		}
		return nil
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}
