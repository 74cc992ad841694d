// Package presets holds the presets shipped with smx: one small YAML file
// per agent (image recipe, profile, credentials, environment, command).
// They are data, not code; internal/preset reads and checks them, and
// users add their own in ~/.config/smx/presets/.
package presets

import "embed"

// FS holds the shipped preset files, NAME.yaml each.
//
//go:embed *.yaml
var FS embed.FS
