package shim

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	cgstats "github.com/containerd/cgroups/v3/cgroup1/stats"
	taskapi "github.com/containerd/containerd/api/runtime/task/v2"
	cerrdefs "github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/protobuf"
	"github.com/containerd/typeurl/v2"

	"github.com/smx-dev/smx/internal/errdefs"
)

// Stats reports the VM the task runs in, as cgroup v1 metrics: QEMU's
// CPU time (user and system) and resident memory on the host, and the
// task's running processes. A pod's containers share one VM, so each of
// them reports the whole pod's figures.
func (s *Shim) Stats(ctx context.Context, r *taskapi.StatsRequest) (*taskapi.StatsResponse, error) {
	if _, err := s.get(r.ID); err != nil {
		return nil, err
	}
	s.mu.Lock()
	vm := s.vm
	s.mu.Unlock()
	if vm == nil {
		return nil, cerrdefs.ToGRPC(fmt.Errorf("task %s: no sandbox: %w", r.ID, cerrdefs.ErrNotFound))
	}
	in, err := s.svc.Inspect(ctx, vm.name)
	if err != nil {
		return nil, grpcErr(err)
	}
	m, err := qemuMetrics(in.State.QEMUPID)
	if err != nil {
		return nil, grpcErr(fmt.Errorf("smx shim: stats of sandbox %s: %w", vm.name, err))
	}
	if pids, err := s.Pids(ctx, &taskapi.PidsRequest{ID: r.ID}); err == nil {
		m.Pids = &cgstats.PidsStat{Current: uint64(len(pids.Processes))}
	}
	a, err := typeurl.MarshalAny(m)
	if err != nil {
		return nil, grpcErr(err)
	}
	return &taskapi.StatsResponse{Stats: protobuf.FromAny(a)}, nil
}

// qemuMetrics reads a QEMU process's CPU time and resident memory from
// the host's /proc.
func qemuMetrics(pid int) (*cgstats.Metrics, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("the VM is not running: %w", errdefs.ErrFailed)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	// Fields after the command name (which may hold spaces), from field 3.
	rest := string(b)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 22 {
		return nil, fmt.Errorf("short /proc/%d/stat", pid)
	}
	utime, _ := strconv.ParseUint(f[11], 10, 64)    // field 14
	stime, _ := strconv.ParseUint(f[12], 10, 64)    // field 15
	rssPages, _ := strconv.ParseUint(f[21], 10, 64) // field 24
	const tick = uint64(time.Second) / 100          // USER_HZ
	user, sys := utime*tick, stime*tick
	rss := rssPages * uint64(os.Getpagesize())
	return &cgstats.Metrics{
		CPU:    &cgstats.CPUStat{Usage: &cgstats.CPUUsage{Total: user + sys, User: user, Kernel: sys}},
		Memory: &cgstats.MemoryStat{RSS: rss, TotalRSS: rss, Usage: &cgstats.MemoryEntry{Usage: rss}},
	}, nil
}
