// Command report runs smx's side-by-side benchmarks and writes
// docs/benchmarks.md from their own output: the machine they ran on (CPU,
// cores, accelerator, QEMU, host and guest kernel, load, date) and, per
// benchmark, the figures and the ratios each reports against its peer.
// The document is only ever written by this command, so every figure in
// it comes with the conditions it was measured under.
//
//	scripts/bench.sh              # every benchmark in internal/bench, -benchtime 3x
//	scripts/bench.sh -quick       # start, exec and pause/resume only, -benchtime 2x
//	go run ./internal/bench/report -bench 'Git|SSH' -benchtime 1x -o /tmp/b.md
//
// It needs what the VM benchmarks need: built binaries in $SMX_BIN and
// cached guest kernels in $SMX_TEST_KERNELS (scripts/bench.sh sets both).
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/smx-dev/smx/internal/kernel"
	"github.com/smx-dev/smx/internal/vm"
)

// quick is the subset -quick runs: the start path against bare QEMU, an
// exec's round trip, and pause/resume.
const quick = `^Benchmark(ColdStart|Exec|PauseResume)$`

func main() {
	var (
		bench     = flag.String("bench", ".", "benchmarks to run (go test -bench)")
		benchtime = flag.String("benchtime", "3x", "go test -benchtime")
		short     = flag.Bool("quick", false, "run only "+quick+" with -benchtime 2x")
		pkgs      = flag.String("pkg", "./internal/bench/", "packages whose benchmarks run, comma-separated")
		out       = flag.String("o", "docs/benchmarks.md", "file to write")
		timeout   = flag.Duration("timeout", 3*time.Hour, "go test -timeout")
	)
	flag.Parse()
	if *short {
		*bench, *benchtime = quick, "2x"
	}
	if err := run(*bench, *benchtime, strings.Split(*pkgs, ","), *out, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "bench report:", err)
		os.Exit(1)
	}
}

func run(bench, benchtime string, pkgs []string, out string, timeout time.Duration) error {
	m := machine()
	m.loadBefore = loadavg()
	m.started = time.Now().UTC()
	args := append([]string{"test", "-run", "^$", "-bench", bench, "-benchtime", benchtime,
		"-timeout", timeout.String(), "-count", "1"}, pkgs...)
	cmd := exec.Command("go", args...)
	var buf bytes.Buffer
	cmd.Stdout = io.MultiWriter(os.Stderr, &buf) // progress as it comes
	cmd.Stderr = os.Stderr
	fmt.Fprintf(os.Stderr, "==> go %s\n", strings.Join(args, " "))
	err := cmd.Run()
	m.took = time.Since(m.started).Round(time.Second)
	m.loadAfter = loadavg()
	results := parse(&buf)
	if len(results) == 0 {
		return fmt.Errorf("no benchmark results (go test: %v)", err)
	}
	failed := ""
	if err != nil {
		failed = fmt.Sprintf("go test ended with %v: some benchmarks failed or were skipped; their rows are missing.", err)
	}
	doc := render(m, "go "+strings.Join(args, " "), results, failed)
	if err := os.WriteFile(out, []byte(doc), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "==> wrote %s (%d results)\n", out, len(results))
	return nil
}

// host is what the figures depend on besides smx itself.
type host struct {
	cpu, accel, accelWhy, qemu, kernel, guestKernel, goVersion string
	cores                                                      int
	loadBefore, loadAfter                                      string
	started                                                    time.Time
	took                                                       time.Duration
}

func machine() host {
	h := host{cores: runtime.NumCPU(), goVersion: runtime.Version(), cpu: "unknown", qemu: "not found"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				h.cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	a, why := vm.DetectAccel()
	h.accel, h.accelWhy = string(a), why
	if p, err := exec.LookPath("qemu-system-x86_64"); err == nil {
		if v, err := vm.QEMUVersion(context.Background(), p); err == nil {
			h.qemu = v
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.kernel = strings.TrimSpace(string(b))
	}
	h.guestKernel = "unknown ($SMX_TEST_KERNELS not set)"
	if d := os.Getenv("SMX_TEST_KERNELS"); d != "" {
		if k, err := kernel.Find(d); err == nil {
			h.guestKernel = k.Version
		}
	}
	return h
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// result is one line of `go test -bench` output.
type result struct {
	pkg, name string
	n         int
	metrics   []metric // in the order reported; ns/op first
	notes     []string // what the benchmark logged (b.Log), e.g. ratios it does not report as metrics
}

type metric struct {
	unit  string
	value float64
}

// parse reads benchmark lines ("BenchmarkX/sub-2  3  123 ns/op  0.5 a/b")
// and the "pkg:" lines that say which package they belong to.
func parse(r io.Reader) []result {
	var out []result
	pkg, logging := "", ""
	notes := map[string][]string{} // benchmark → its log lines
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimSpace(p)
			continue
		}
		if b, ok := strings.CutPrefix(line, "--- BENCH: "); ok {
			logging = pkg + " " + trimProcs(strings.TrimSpace(b))
			continue
		}
		if logging != "" && strings.HasPrefix(line, "    ") {
			// "    file_test.go:94: message"
			msg := strings.TrimSpace(line)
			if i := strings.Index(msg, ": "); i > 0 && strings.Contains(msg[:i], ".go:") {
				msg = msg[i+2:]
			}
			if !slices.Contains(notes[logging], msg) {
				notes[logging] = append(notes[logging], msg)
			}
			continue
		}
		logging = ""
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		res := result{pkg: pkg, name: trimProcs(f[0]), n: n}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				break
			}
			res.metrics = append(res.metrics, metric{unit: f[i+1], value: v})
		}
		out = append(out, res)
	}
	for i := range out {
		out[i].notes = notes[out[i].pkg+" "+out[i].name]
	}
	return out
}

// trimProcs drops the -GOMAXPROCS suffix go test adds to a name.
func trimProcs(name string) string {
	if i := strings.LastIndex(name, "-"); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			return name[:i]
		}
	}
	return name
}

func render(h host, command string, results []result, failed string) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# smx benchmarks\n\n")
	w("<!-- Written by internal/bench/report (scripts/bench.sh); do not edit by hand: run it again. -->\n\n")
	w("Every figure here was measured by the command below, side by side with its peer in the same\n")
	w("run (bare QEMU booting the same kernel, host tools, QEMU's own devices), so the ratios\n")
	w("are what to read: absolute times move with the machine and its load. How each benchmark\n")
	w("is built, and its goal, is in its doc comment in `internal/bench`.\n\n")
	w("| | |\n|---|---|\n")
	w("| date | %s (took %s) |\n", h.started.Format("2006-01-02 15:04 MST"), h.took)
	w("| CPU | %s, %d cores |\n", h.cpu, h.cores)
	w("| accelerator | %s (%s) |\n", h.accel, h.accelWhy)
	w("| QEMU | %s |\n", h.qemu)
	w("| host kernel | %s |\n", h.kernel)
	w("| guest kernel | %s |\n", h.guestKernel)
	w("| load average (1, 5, 15 min) | %s before, %s after |\n", h.loadBefore, h.loadAfter)
	w("| Go | %s |\n", h.goVersion)
	w("| command | `%s` |\n\n", cell(command))
	if failed != "" {
		w("**%s**\n\n", failed)
	}
	if l := firstLoad(h.loadBefore); l > float64(h.cores) {
		w("The machine was busy with other work (load %.1f on %d cores): absolute times are\n", l, h.cores)
		w("inflated and noisy; compare ratios, and medians over runs, never single figures.\n\n")
	}

	// Group sub-benchmarks under their top-level benchmark.
	groups := map[string][]result{}
	var order []string
	for _, r := range results {
		top, _, _ := strings.Cut(r.name, "/")
		key := r.pkg + " " + top
		if _, ok := groups[key]; !ok {
			order = append(order, key)
		}
		groups[key] = append(groups[key], r)
	}
	for _, key := range order {
		rs := groups[key]
		pkg, top, _ := strings.Cut(key, " ")
		w("## %s\n\n`%s`\n\n", strings.TrimPrefix(top, "Benchmark"), pkg)
		w("| benchmark | runs | time/op | other metrics |\n|---|---|---|---|\n")
		var ratios []string
		for _, r := range rs {
			var other []string
			tpo := ""
			for _, m := range r.metrics {
				switch {
				case m.unit == "ns/op":
					tpo = duration(m.value)
				case strings.Contains(m.unit, "/") && !strings.HasSuffix(m.unit, "/op") && !strings.HasSuffix(m.unit, "/min") && !strings.HasPrefix(m.unit, "s/"):
					ratios = append(ratios, fmt.Sprintf("| %s | %s | **%.2f×** |", r.name, m.unit, m.value))
				default:
					other = append(other, fmt.Sprintf("%s %s", num(m.value), m.unit))
				}
			}
			w("| %s | %d | %s | %s |\n", r.name, r.n, tpo, cell(strings.Join(other, ", ")))
		}
		w("\n")
		for _, r := range rs {
			for _, n := range r.notes {
				w("- %s: %s\n", r.name, n)
			}
			if len(r.notes) > 0 {
				w("\n")
			}
		}
		if len(ratios) > 0 {
			sort.Strings(ratios)
			w("| benchmark | ratio | value |\n|---|---|---|\n%s\n\n", strings.Join(ratios, "\n"))
		}
	}
	return b.String()
}

// cell makes s safe inside a Markdown table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func firstLoad(s string) float64 {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// duration prints ns as a readable time.
func duration(ns float64) string {
	d := time.Duration(ns)
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	case d >= time.Microsecond:
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	}
	return fmt.Sprintf("%.0f ns", ns)
}

func num(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}
