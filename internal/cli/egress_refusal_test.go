package cli_test

import "strings"

// upstreamAnswered reports whether out holds an HTTP answer other than
// the gateway's own 403 for a refused request (which names the rule).
func upstreamAnswered(out string) bool {
	return strings.Contains(out, "HTTP/") && !strings.Contains(out, "refused by the sandbox's network profile")
}
