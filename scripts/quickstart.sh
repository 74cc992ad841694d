#!/usr/bin/env bash
# Sets everything up on a fresh Debian/Ubuntu machine and runs a real command
# in a real microVM. Safe to run again: finished steps are skipped.
source "$(dirname "$0")/lib.sh"
need_qemu # Debian 12: QEMU 10 from bookworm-backports (docs/install.md)
need_pkgs make e2fsprogs busybox-static kmod xz-utils ca-certificates git
build
echo "==> smx setup (guest kernel, busybox image)" >&2
$SUDO bin/smx setup
echo "==> smx run --image busybox -- cat /proc/version" >&2
$SUDO bin/smx run --image busybox -- cat /proc/version
