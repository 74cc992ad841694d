package shim

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"sync"
)

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[^a-zA-Z0-9_.-]+`) })

// SandboxName is the smx sandbox that runs task id of containerd
// namespace ns. A container made by the CRI plugin is named after its
// pod, k8s-PODNAMESPACE-POD-CONTAINER-HASH (HASH from the task ID keeps
// a restarted container's sandbox distinct); any other is ctr-NS-ID. The
// name is cleaned to a valid sandbox name and shortened, with a hash of
// the ID, when long.
func SandboxName(ns, id string, annotations map[string]string) string {
	h := sha256.Sum256([]byte(ns + "/" + id))
	sum := hex.EncodeToString(h[:6])
	n := "ctr-" + ns + "-" + id
	if pod := annotations["io.kubernetes.cri.sandbox-name"]; pod != "" {
		n = "k8s-" + annotations["io.kubernetes.cri.sandbox-namespace"] + "-" + pod
		if c := annotations["io.kubernetes.cri.container-name"]; c != "" {
			n += "-" + c
		}
		n += "-" + sum[:6]
	}
	n = nameRE().ReplaceAllString(n, "-")
	if len(n) > 63 {
		n = n[:50] + "-" + sum
	}
	return n
}
