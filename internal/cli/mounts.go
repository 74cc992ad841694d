package cli

import (
	"fmt"

	"smx/internal/errdefs"
	"smx/internal/policy"
	"smx/internal/sandbox"
)

// parseMounts reads the -v flags and checks them against each other and
// against the profile's own files.mounts.
func parseMounts(flags []string, prof *policy.Profile) ([]sandbox.Mount, error) {
	var out []sandbox.Mount
	for _, v := range flags {
		m, err := sandbox.ParseMount(v)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if err := sandbox.CheckMounts(out); err != nil {
		return nil, err
	}
	for _, m := range out {
		for _, pm := range prof.Files.Mounts {
			if pm.Guest == m.Guest {
				return nil, fmt.Errorf("-v %s: the profile already mounts %s at %s (%s): %w", m, pm.Host, pm.Guest, pm.Pos, errdefs.ErrInvalid)
			}
		}
	}
	return out, nil
}

func mountStrings(ms []sandbox.Mount) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.String())
	}
	return out
}
