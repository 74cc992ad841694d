package api_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	wire "github.com/smx-dev/smx/api"
	"github.com/smx-dev/smx/client"
	"github.com/smx-dev/smx/internal/api"
	"github.com/smx-dev/smx/internal/service"
	"github.com/smx-dev/smx/internal/statedir"
	"github.com/smx-dev/smx/internal/testutil"
)

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// BenchmarkExecRoundTrip runs `true` in one sandbox through the API's
// exec WebSocket, the API's buffered POST exec, the service in-process
// (the floor an API can reach) and the CLI, interleaved, and reports the
// median of each and the ratios to the in-process call.
func BenchmarkExecRoundTrip(b *testing.B) {
	bin, home, sock := vmServer(b)
	c := client.New(sock)
	ctx := context.Background()
	const name = "bench-rt"
	c.Remove(ctx, name, true)
	if _, err := c.Create(ctx, client.CreateRequest{Name: name, Memory: "256M", Start: true}); err != nil {
		b.Fatal(err)
	}
	defer c.Remove(ctx, name, true)
	svc := api.ServiceBackend{S: service.New(statedir.Dir{Root: home}, nil)}
	req := wire.ExecRequest{Args: []string{"true"}}
	modes := []struct {
		name string
		run  func() error
	}{
		{"api-ws", func() error { _, err := c.Exec(ctx, name, req, client.ExecIO{}); return err }},
		{"api-post", func() error { _, err := c.Run(ctx, name, req); return err }},
		{"inproc", func() error { _, err := svc.Exec(ctx, name, req, api.ExecIO{}); return err }},
		{"cli", func() error { return testutil.SmxCmd(bin, home, "agent", "exec", name, "--", "true").Run() }},
	}
	times := make([][]time.Duration, len(modes))
	b.ResetTimer()
	for range b.N {
		for i, m := range modes {
			t0 := time.Now()
			if err := m.run(); err != nil {
				b.Fatalf("%s: %v", m.name, err)
			}
			times[i] = append(times[i], time.Since(t0))
		}
	}
	b.StopTimer()
	inproc := median(times[2])
	for i, m := range modes {
		med := median(times[i])
		b.ReportMetric(float64(med.Microseconds())/1000, m.name+"-ms")
		if m.name != "inproc" {
			b.ReportMetric(float64(med)/float64(inproc), m.name+"/inproc")
		}
	}
}

// BenchmarkConcurrentExec runs 100 execs at once spread over 4 sandboxes
// through the API (WebSocket), and the same through the service
// in-process, and reports execs per second of each.
func BenchmarkConcurrentExec(b *testing.B) {
	_, home, sock := vmServer(b)
	c := client.New(sock)
	ctx := context.Background()
	var names []string
	for i := range 4 {
		n := fmt.Sprintf("bench-c%d", i)
		c.Remove(ctx, n, true)
		if _, err := c.Create(ctx, client.CreateRequest{Name: n, Memory: "256M", Start: true}); err != nil {
			b.Fatal(err)
		}
		defer c.Remove(ctx, n, true)
		names = append(names, n)
	}
	svc := api.ServiceBackend{S: service.New(statedir.Dir{Root: home}, nil)}
	req := wire.ExecRequest{Args: []string{"sh", "-c", "echo $$"}}
	batch := func(run func(name string) error) time.Duration {
		var wg sync.WaitGroup
		errs := make(chan error, 100)
		t0 := time.Now()
		for i := range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := run(names[i%4]); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var apiT, inT []time.Duration
	b.ResetTimer()
	for range b.N {
		apiT = append(apiT, batch(func(n string) error { _, err := c.Exec(ctx, n, req, client.ExecIO{}); return err }))
		inT = append(inT, batch(func(n string) error { _, err := svc.Exec(ctx, n, req, api.ExecIO{}); return err }))
	}
	b.StopTimer()
	b.ReportMetric(100/median(apiT).Seconds(), "api-execs/s")
	b.ReportMetric(100/median(inT).Seconds(), "inproc-execs/s")
	b.ReportMetric(float64(median(apiT))/float64(median(inT)), "api/inproc")
}
