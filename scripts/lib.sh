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
