# Shared by quickstart.sh and test.sh: install host packages (idempotent,
# fast when done) and build the binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

need_pkgs() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		echo "==> installing ${missing[*]}" >&2
		export DEBIAN_FRONTEND=noninteractive
		$SUDO apt-get install -y --no-install-recommends "${missing[@]}" >&2 ||
			{ $SUDO apt-get update >&2 && $SUDO apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
	fi
}

need_go() {
	if ! command -v go >/dev/null 2>&1; then
		echo "error: Go 1.26 or newer is needed to build smx: https://go.dev/doc/install" >&2
		exit 1
	fi
}

build() {
	need_go
	echo "==> building bin/smx and bin/smx-agent" >&2
	make -s all
}

# qemu_at_least MAJOR.MINOR: the installed qemu-system-x86 package is that
# version or newer.
qemu_at_least() {
	local v
	v="$(dpkg-query -W -f='${Version}' qemu-system-x86 2>/dev/null)" || return 1
	[ -n "$v" ] && dpkg --compare-versions "$v" ge "1:$1"
}

# need_qemu installs QEMU and qemu-img. On Debian 12 they come from
# bookworm-backports (10.0): mounts over virtio-fs, and mounts added to a
# running sandbox, need 8.2 or newer, and the distribution has 7.2. The
# backports source is added once; nothing else is taken from it. Elsewhere
# the distribution's own (Ubuntu 24.04: 8.2). SMX_QEMU_BACKPORTS=0 keeps
# Debian 12's 7.2.
need_qemu() {
	local id="" codename=""
	if [ -r /etc/os-release ]; then
		id="$(. /etc/os-release && echo "${ID:-}")"
		codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
	fi
	if [ "$id" != debian ] || [ "$codename" != bookworm ] || [ "${SMX_QEMU_BACKPORTS:-1}" != 1 ]; then
		need_pkgs qemu-system-x86 qemu-utils
		return
	fi
	qemu_at_least 8.2 && return
	export DEBIAN_FRONTEND=noninteractive
	if ! grep -rqs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
		echo "==> adding bookworm-backports to apt's sources (for QEMU 10)" >&2
		echo "deb http://deb.debian.org/debian bookworm-backports main" |
			$SUDO tee /etc/apt/sources.list.d/smx-bookworm-backports.list >/dev/null
		$SUDO apt-get update >&2
	fi
	echo "==> installing QEMU from bookworm-backports" >&2
	$SUDO apt-get install -y --no-install-recommends -t bookworm-backports qemu-system-x86 qemu-utils >&2 ||
		{ $SUDO apt-get update >&2 && $SUDO apt-get install -y --no-install-recommends -t bookworm-backports qemu-system-x86 qemu-utils >&2; }
}

# need_debian12_qemu DIR unpacks Debian 12's own QEMU 7.2 under DIR (not
# installed: beside the system's QEMU) with a wrapper DIR/qemu-system-x86_64
# that points it at its own modules and firmware, for the tests that keep
# the older QEMU covered (SMX_QEMU). Libraries it needs that are missing
# are installed from the distribution. Done once; fast when done.
need_debian12_qemu() {
	local dir="$1" tmp v vdata vbios deb
	[ -x "$dir/qemu-system-x86_64" ] && return
	v="$(apt-cache madison qemu-system-x86 | awk '$3 ~ /^1:7\.2/ {print $3; exit}')"
	vdata="$(apt-cache madison qemu-system-data | awk '$3 ~ /^1:7\.2/ {print $3; exit}')"
	vbios="$(apt-cache madison seabios | awk '$3 !~ /bpo/ {print $3; exit}')"
	if [ -z "$v" ] || [ -z "$vdata" ] || [ -z "$vbios" ]; then
		echo "error: apt's sources have no QEMU 7.2 (Debian 12's): cannot keep the older QEMU covered" >&2
		return 1
	fi
	echo "==> unpacking Debian 12's QEMU $v into $dir (for the tests on the older QEMU)" >&2
	tmp="$(mktemp -d)"
	chmod 755 "$tmp" # apt's download user writes there
	(cd "$tmp" && apt-get download qemu-system-x86="$v" qemu-system-common="$v" qemu-system-data="$vdata" seabios="$vbios" >&2)
	local deps=()
	for deb in "$tmp"/qemu-system-x86_*.deb "$tmp"/qemu-system-common_*.deb; do
		# Depends: "libfoo1 (>= 1.2), liba | libb, qemu-system-common (= ...)":
		# the first choice of each, without versions or QEMU's own packages.
		while read -r p; do
			case "$p" in qemu-* | "") ;; *) deps+=("$p") ;; esac
		done < <(dpkg-deb -f "$deb" Depends | tr ',' '\n' | sed 's/|.*//; s/(.*//; s/:any//; s/[[:space:]]//g')
	done
	need_pkgs "${deps[@]}"
	$SUDO rm -rf "$dir.tmp"
	$SUDO mkdir -p "$dir.tmp"
	for deb in "$tmp"/*.deb; do $SUDO dpkg-deb -x "$deb" "$dir.tmp"; done
	$SUDO tee "$dir.tmp/qemu-system-x86_64" >/dev/null <<WRAP
#!/bin/sh
# Debian 12's QEMU $v, unpacked beside the system's: its own modules and firmware.
export QEMU_MODULE_DIR=$dir/usr/lib/x86_64-linux-gnu/qemu
exec $dir/usr/bin/qemu-system-x86_64 -L $dir/usr/share/qemu -L $dir/usr/share/seabios "\$@"
WRAP
	$SUDO chmod 755 "$dir.tmp/qemu-system-x86_64"
	$SUDO rm -rf "$dir"
	$SUDO mv "$dir.tmp" "$dir"
	rm -rf "$tmp"
}
