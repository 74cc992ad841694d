// Package bench holds side-by-side benchmarks of smx against bare QEMU.
package bench
