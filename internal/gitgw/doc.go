// Package gitgw is the Git gateway: it enforces a profile's git rules on
// what a sandbox reads from and pushes to Git forges, and adds the forge
// credential on the host, so the guest never holds a token.
//
// Over HTTPS (Gateway.Handler) the network gateway terminates the guest's
// TLS to a forge the profile names (policy.Profile.IsForge) and hands each
// HTTP/1.1 request here: Git smart HTTP (info/refs, git-upload-pack,
// git-receive-pack; protocol v0, v1, v2) is decided per repository and per
// ref and forwarded with the credential. Other requests to the forge's
// name are refused when their path lies under a repository a rule denies
// reading, or names Git's own files (dumb HTTP, never served); the rest go
// on without the credential unless its request matchers allow.
//
// # The transport-independent core
//
// Everything that decides is free of HTTP, so the SSH gateway runs a push
// over an exec channel ("git-receive-pack 'acme/app.git'") through the
// same code and meets the same rules:
//
//   - policy.NormalizeRepo turns the path the client named into the
//     repository identity ("forge/owner/name") that rules are decided on;
//     refuse what it refuses.
//   - Reads: Profile.Decide with policy.KindGit, Access "read"; a refusal
//     is sent as ErrLine(ReadRefusal(...)) before anything else, which the
//     client prints as "remote error: ...".
//   - Pushes: ParsePushRequest reads the commands off the client's stream
//     and leaves the stream at the pack; DecideRequest decides its push
//     options (one the profile does not name refuses the push) and then,
//     with DecidePush, every command (atomic when the client asked), calling back for an Ancestry only when
//     fast-forward matters; Mirrors.Open gives one, over a host-side mirror
//     updated by a Fetcher (the SSH gateway supplies one that fetches over
//     its own upstream connection) plus the pushed pack in a quarantine.
//     PushRequest.Encode writes the allowed commands for the upstream
//     receive-pack, followed by the pack when any allowed command needs it.
//   - Results: ParseReport (after Demux when side-band-64k is on) reads the
//     upstream's report-status; Report.Encode (wrapped with Sideband(1, ...)
//     and a flush when side-band-64k is on) writes the merged report with
//     an "ng REF smx: ..." line for every refused ref.
//   - StreamPush strings these together over a byte stream (the SSH
//     gateway's exec channel), with StreamFetcher updating the mirror over
//     the same transport; the HTTP handler and it share the report merge
//     and the records.
//
// Records go to Config.Log as git.fetch, git.push and git.refused (see
// internal/audit) with repository, refs, old and new ids, bytes, the rule
// and the credential's name, never its value.
package gitgw
