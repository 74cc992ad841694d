#!/bin/sh
# Run smx's side-by-side benchmarks and regenerate docs/benchmarks.md from
# their output (internal/bench/report). Arguments go to the report command:
#   scripts/bench.sh            every benchmark in internal/bench
#   scripts/bench.sh -quick     start path, exec, pause/resume (minutes)
#   scripts/bench.sh -bench Git -benchtime 1x
# Guest kernels come from $SMX_TEST_KERNELS (default /var/lib/smx/kernels,
# where scripts/test.sh puts them); the binaries are built here first.
set -eu
cd "$(dirname "$0")/.."
make -s all
export SMX_BIN="$PWD/bin"
export SMX_TEST_KERNELS="${SMX_TEST_KERNELS:-/var/lib/smx/kernels}"
export SMX_TEST_KERNEL_CACHE="${SMX_TEST_KERNEL_CACHE:-$SMX_TEST_KERNELS}"
export SMX_TEST_IMAGES="${SMX_TEST_IMAGES:-$(dirname "$SMX_TEST_KERNELS")/images}"
exec go run ./internal/bench/report "$@"
