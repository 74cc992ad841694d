#!/usr/bin/env bash
# The cluster-level tests (opt-in; not part of scripts/test.sh or CI): etcd,
# kube-apiserver, kube-scheduler and kubelet, built from their released Go
# modules (test/cluster/go.mod), run a RuntimeClass smx pod to Completed on a
# private containerd with the smx runtime (internal/shim's TestCluster);
# kubernetes-sigs/agent-sandbox's controller (test/agent-sandbox/go.mod) on
# the same cluster runs deploy/kubernetes/agent-sandbox.yaml's Sandbox,
# SandboxWarmPool and SandboxClaim as smx pods (TestClusterAgentSandbox); a
# pod annotated io.smx.from-snapshot is restored from a snapshot another
# state directory pushed to a registry on loopback
# (TestClusterRestoreFromRegistry).
# Needs root (kubelet). Arguments go to `go test`.
#
#   scripts/cluster-test.sh           build the binaries once per version, run the test
#   scripts/cluster-test.sh --build   only build them
source "$(dirname "$0")/lib.sh"
need_pkgs make qemu-system-x86 qemu-utils e2fsprogs busybox-static kmod xz-utils ca-certificates iproute2 util-linux containerd runc
build_only=false
if [ "${1:-}" = --build ]; then
	build_only=true
	shift
fi

export SMX_TEST_KERNELS="${SMX_TEST_KERNELS:-/var/lib/smx/kernels}"
export SMX_TEST_KERNEL_CACHE="$SMX_TEST_KERNELS"

# The cluster's programs, built once per Kubernetes version into the cache
# beside the kernels (etcd, kube-apiserver, kube-scheduler and kubelet: 17
# min measured with an empty build cache, nice'd, on the 2 cores a CI run
# was using too), static and version-stamped as Kubernetes' own build makes
# them. kube-controller-manager (20 min, nice'd, beside a CI run and
# the agent-sandbox build) runs only its garbage collector, for
# TestClusterAgentSandbox.
K8S_VERSION="$(cd test/cluster && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
export SMX_TEST_K8S_BIN="$(dirname "$SMX_TEST_KERNELS")/tools/k8s-$K8S_VERSION"
missing=()
for cmd in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
	[ -x "$SMX_TEST_K8S_BIN/$cmd" ] || missing+=("$cmd")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "==> building ${missing[*]} $K8S_VERSION (once per version)" >&2
	minor="${K8S_VERSION#v1.}"
	minor="${minor%%.*}"
	ldflags="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags="$ldflags -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	out="$(mktemp -d)"
	(
		cd test/cluster
		export CGO_ENABLED=0 GOFLAGS=-trimpath
		for cmd in "${missing[@]}"; do
			pkg="k8s.io/kubernetes/cmd/$cmd"
			if [ "$cmd" = etcd ]; then
				pkg=go.etcd.io/etcd/server/v3
			fi
			nice -n 10 go build -ldflags="$ldflags" -o "$out/$cmd" "$pkg"
		done
	)
	$SUDO mkdir -p "$SMX_TEST_K8S_BIN"
	$SUDO mv "$out"/* "$SMX_TEST_K8S_BIN/"
	rmdir "$out"
	$SUDO chmod 755 "$SMX_TEST_K8S_BIN"
fi

# kubernetes-sigs/agent-sandbox's controller (TestClusterAgentSandbox),
# from its module (test/agent-sandbox/go.mod), once per version beside
# them (17 min, nice'd, beside a CI run and the kube-controller-manager
# build); the test reads the project's CRDs from the module cache.
ASB_VERSION="$(cd test/agent-sandbox && go list -m -f '{{.Version}}' sigs.k8s.io/agent-sandbox)"
export SMX_TEST_AGENT_SANDBOX="$(dirname "$SMX_TEST_KERNELS")/tools/agent-sandbox-$ASB_VERSION"
if [ ! -x "$SMX_TEST_AGENT_SANDBOX/agent-sandbox-controller" ]; then
	echo "==> building agent-sandbox-controller $ASB_VERSION (once per version)" >&2
	out="$(mktemp -d)"
	(
		cd test/agent-sandbox
		export CGO_ENABLED=0 GOFLAGS=-trimpath
		nice -n 10 go build -ldflags="-s -w" -o "$out/agent-sandbox-controller" sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller
	)
	$SUDO mkdir -p "$(dirname "$SMX_TEST_AGENT_SANDBOX")"
	$SUDO rm -rf "$SMX_TEST_AGENT_SANDBOX"
	$SUDO mv "$out" "$SMX_TEST_AGENT_SANDBOX"
	$SUDO chmod 755 "$SMX_TEST_AGENT_SANDBOX"
fi
if $build_only; then
	echo "$SMX_TEST_K8S_BIN $SMX_TEST_AGENT_SANDBOX" >&2
	exit 0
fi

build
# A guest kernel, unless the cache has one (scripts/test.sh builds smx's own).
if [ -z "$(ls -A "$SMX_TEST_KERNELS" 2>/dev/null)" ]; then
	echo "==> smx setup --no-image (guest kernel into $SMX_TEST_KERNELS)" >&2
	$SUDO env SMX_HOME="$(dirname "$SMX_TEST_KERNELS")" bin/smx setup --no-image
fi
export SMX_BIN="$PWD/bin"
echo "==> go test -run TestCluster ./internal/shim" >&2
$SUDO env "PATH=$PATH" SMX_BIN="$SMX_BIN" SMX_TEST_KERNELS="$SMX_TEST_KERNELS" \
	SMX_TEST_KERNEL_CACHE="$SMX_TEST_KERNEL_CACHE" SMX_TEST_K8S_BIN="$SMX_TEST_K8S_BIN" \
	SMX_TEST_AGENT_SANDBOX="$SMX_TEST_AGENT_SANDBOX" CI="${CI:-}" \
	go test -count=1 -timeout 30m -run '^TestCluster' -v "$@" ./internal/shim
