package vm

import "time"

func rdtsc() uint64

// measureTSCKHz times the host TSC against the monotonic clock. It costs
// about 20 ms, once per process.
func measureTSCKHz() int {
	t0, c0 := time.Now(), rdtsc()
	time.Sleep(20 * time.Millisecond)
	c1, t1 := rdtsc(), time.Now()
	return int(float64(c1-c0) / float64(t1.Sub(t0).Microseconds()) * 1000)
}
