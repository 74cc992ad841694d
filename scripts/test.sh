#!/usr/bin/env bash
# Runs the whole test suite: unit tests, and CLI tests that boot real
# microVMs (TCG when KVM is not usable) against real tools on loopback.
# The cluster-level test (kubelet, apiserver, a RuntimeClass pod) is not
# part of it: scripts/cluster-test.sh runs it.
source "$(dirname "$0")/lib.sh"
need_qemu # Debian 12: QEMU 10 from bookworm-backports; the suite runs on it
need_pkgs make e2fsprogs busybox-static kmod xz-utils debootstrap tmux util-linux ca-certificates iproute2 git openssh-server rsync containerd runc
# The web console's browser test drives Debian's Chromium (headless, loopback
# only); the fonts make its screenshots readable.
need_pkgs chromium fonts-dejavu-core
# The Python client (python/) is installed with pip into a venv by internal/api's tests.
need_pkgs python3 python3-venv python3-pip python3-mypy
build
# The guest kernel is downloaded once into the shared cache; tests make their
# own state directories and link this cache in.
export SMX_TEST_KERNELS="${SMX_TEST_KERNELS:-/var/lib/smx/kernels}"
export SMX_TEST_KERNEL_CACHE="$SMX_TEST_KERNELS"
# Both guest kernels: Debian's package, and smx's own built from Debian's
# kernel source (once per source version and config; about 15 min on 2
# cores, cached in the same directory). The suite runs on smx's own (new
# sandboxes prefer it); the stock kernel keeps its tests (TestBuildRealKernel,
# TestBoot/stock) and the unprivileged run below, whose state has only it.
echo "==> smx setup --no-image --kernel smx (guest kernels into $SMX_TEST_KERNELS)" >&2
$SUDO env SMX_HOME="$(dirname "$SMX_TEST_KERNELS")" bin/smx setup --no-image --kernel smx
# A Debian image with git, ssh, scp, sftp and rsync for the gateway tests, built
# once with debootstrap (about a minute) and kept beside the kernels, named by
# its package list so a changed list builds a new one.
DEBIAN_TEST_PACKAGES="rsync"
export SMX_TEST_IMAGES="$(dirname "$SMX_TEST_KERNELS")/images"
export SMX_TEST_DEBIAN_IMAGE="devtest-$(printf '%s' "$DEBIAN_TEST_PACKAGES" | sha256sum | cut -c1-8)"
if [ ! -f "$SMX_TEST_IMAGES/$SMX_TEST_DEBIAN_IMAGE/image.json" ]; then
	echo "==> smx image build $SMX_TEST_DEBIAN_IMAGE --from debian (test image, once)" >&2
	$SUDO env SMX_HOME="$(dirname "$SMX_TEST_KERNELS")" bin/smx image build "$SMX_TEST_DEBIAN_IMAGE" --from debian --packages "$DEBIAN_TEST_PACKAGES" >&2
fi
# The claude and codex presets' images (Debian, Node.js, the agent at the
# preset's pinned version), named by its recipe hash: built once (2m39s measured
# cold on the 2-core machine), reused while the recipe is unchanged. Its npm
# packages come through the host's npm.
command -v npm >/dev/null 2>&1 || need_pkgs npm
# SMX_TEST_SLOW=1 adds the slower suite's gemini (TestAgentRunGemini;
# 2m49s cold, nearly 10 min on a loaded machine); without it that test skips.
# docker (Debian's docker.io, containerd, runc, iptables; no npm) is
# TestAgentRunDocker's: 1m22s cold.
presets="claude codex docker"
[ "${SMX_TEST_SLOW:-}" = 1 ] && presets="$presets gemini"
for preset in $presets; do # codex: 3m20s cold
	echo "==> smx image preset $preset (built once per recipe)" >&2
	$SUDO env SMX_HOME="$(dirname "$SMX_TEST_KERNELS")" bin/smx image preset "$preset" >&2
done
export SMX_BIN="$PWD/bin"
# crictl for internal/shim's TestCRI, built from the Go module proxy once per
# version (about 7 min cold on 2 cores) and kept beside the kernels.
CRICTL_VERSION=v1.34.0
export SMX_TEST_CRICTL="$(dirname "$SMX_TEST_KERNELS")/tools/crictl-$CRICTL_VERSION"
if [ ! -x "$SMX_TEST_CRICTL" ]; then
	echo "==> go install crictl@$CRICTL_VERSION (once per version)" >&2
	crictl_dir="$(mktemp -d)"
	GOBIN="$crictl_dir" go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
	$SUDO mkdir -p "$(dirname "$SMX_TEST_CRICTL")"
	$SUDO mv "$crictl_dir/crictl" "$SMX_TEST_CRICTL"
	rm -rf "$crictl_dir"
fi

# As root (CI), the CLI scripts that need no root also run once as an
# ordinary user with a PATH without /usr/sbin, from `smx setup` on: what a
# rootless user gets. The user's state directory is its own.
if [ "$(id -u)" -eq 0 ]; then
	echo "==> CLI scripts as an unprivileged user (smx-ci)" >&2
	id smx-ci >/dev/null 2>&1 || useradd --create-home --shell /bin/sh smx-ci
	u=/home/smx-ci/smx-test
	rm -rf "$u/bin" "$u/internal" "$u/cli.test" # its state (kernel cache) is kept
	mkdir -p "$u/bin" "$u/internal/cli"
	cp bin/smx bin/smx-agent "$u/bin/"
	cp -r internal/cli/testdata "$u/internal/cli/"
	go test -c -o "$u/cli.test" ./internal/cli
	chown -R smx-ci: "$u"
	runuser -u smx-ci -- env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/home/smx-ci CI=true \
		SMX_HOME="$u/state" SMX_BIN="$u/bin" SMX_TEST_KERNELS="$u/state/kernels" \
		sh -c "cd '$u/internal/cli' && '$u/bin/smx' setup --no-image >&2 &&
			'$u/cli.test' -test.count=1 -test.timeout=20m -test.run 'TestScripts/(run|lifecycle|image|kernel|template|badinput|snapshot|logs)\$'"
fi

# Tests' artefacts (the console's screenshots) are kept under the output
# directory: $SMX_TEST_OUTPUT, default test-output/ in the tree.
out="${SMX_TEST_OUTPUT:-$PWD/test-output}"
mkdir -p "$out"
echo "==> go test ./... (artefacts in $out)" >&2
rc=0
go test -count=1 -timeout 60m -artifacts -outputdir "$out" "$@" ./... || rc=$?

# The suite ran on the QEMU installed above (Debian 12: 10.0 from
# bookworm-backports). The older QEMU smx still supports keeps the tests of
# what differs there covered: the file gateway (9P instead of virtio-fs) and
# snapshots, forks and templates, on Debian 12's own 7.2 unpacked beside it
# (kept with the kernels, outside the clone).
if qemu_at_least 8.2 && [ "$(. /etc/os-release && echo "${ID:-}:${VERSION_CODENAME:-}")" = debian:bookworm ]; then
	old="$(dirname "$SMX_TEST_KERNELS")/qemu-7.2"
	need_debian12_qemu "$old"
	echo "==> file-gateway and snapshot tests on Debian 12's QEMU 7.2 ($old)" >&2
	SMX_QEMU="$old/qemu-system-x86_64" go test -count=1 -timeout 60m "$@" ./internal/snapshot ./internal/fsgw ./internal/cli \
		-run '^(TestFiles.*|TestProfileMountOwner|TestRestoreRepeatedly|TestSnapshot.*|TestScripts/(files|snapshot|template|limits_fork))$' || rc=$?
fi
exit $rc
