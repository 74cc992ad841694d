#!/usr/bin/env bash
# Runs the whole test suite: unit tests, and CLI tests that boot real
# microVMs (TCG when KVM is not usable) against real tools on loopback.
source "$(dirname "$0")/lib.sh"
need_pkgs make qemu-system-x86 qemu-utils e2fsprogs busybox-static kmod xz-utils debootstrap tmux util-linux ca-certificates iproute2 git openssh-server rsync
build
# The guest kernel is downloaded once into the shared cache; tests make their
# own state directories and link this cache in.
export SMX_TEST_KERNELS="${SMX_TEST_KERNELS:-/var/lib/smx/kernels}"
export SMX_TEST_KERNEL_CACHE="$SMX_TEST_KERNELS"
echo "==> smx setup --no-image (guest kernel into $SMX_TEST_KERNELS)" >&2
$SUDO env SMX_HOME="$(dirname "$SMX_TEST_KERNELS")" bin/smx setup --no-image
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
export SMX_BIN="$PWD/bin"

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

echo "==> go test ./..." >&2
go test -count=1 -timeout 60m "$@" ./...
