package policy

import (
	"embed"
	"fmt"
	"slices"
	"sync"
)

//go:embed builtin/*.yaml
var builtinFS embed.FS

var builtinNames = []string{"locked", "dev", "open"}

// builtins are parsed once each, on first use (a start parses only its
// own: the three took 4-7 ms). A broken built-in is a bug in smx, caught
// by the tests, so it panics.
var builtins = func() map[string]func() *Profile {
	m := make(map[string]func() *Profile, len(builtinNames))
	noExtends := func(ref string) (*Profile, error) {
		return nil, fmt.Errorf("built-in profiles do not extend")
	}
	for _, name := range builtinNames {
		m[name] = sync.OnceValue(func() *Profile {
			data, err := builtinFS.ReadFile("builtin/" + name + ".yaml")
			if err != nil {
				panic(err)
			}
			p, err := parse("builtin/"+name+".yaml", "builtin", data, noExtends)
			if err != nil {
				panic(fmt.Sprintf("policy: built-in profile %s: %v", name, err))
			}
			return p
		})
	}
	return m
}()

// Builtin returns the built-in profile called name: "locked" (deny-all),
// "dev" (default-deny with registries, forges and model APIs) or "open"
// (allow-all). Profiles are immutable, so the same value is shared.
func Builtin(name string) (*Profile, bool) {
	p, ok := builtins[name]
	if !ok {
		return nil, false
	}
	return p(), true
}

// BuiltinNames lists the built-in profiles, most restrictive first.
func BuiltinNames() []string { return slices.Clone(builtinNames) }

// BuiltinSource returns the YAML text of a built-in profile, comments
// included, as shipped.
func BuiltinSource(name string) ([]byte, bool) {
	if !slices.Contains(builtinNames, name) {
		return nil, false
	}
	data, err := builtinFS.ReadFile("builtin/" + name + ".yaml")
	return data, err == nil
}
