package shim

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	runtimeoptions "github.com/containerd/containerd/pkg/runtimeoptions/v1"
	ptypes "github.com/containerd/containerd/protobuf/types"
	"github.com/containerd/typeurl/v2"
	"go.yaml.in/yaml/v3"

	"github.com/smx-dev/smx/internal/errdefs"
)

// ConfigFile is the node's shim settings, in the smx state directory
// (/var/lib/smx/containerd-shim.yaml as root). A runtime handler can name
// another file with containerd's runtime option ConfigPath.
const ConfigFile = "containerd-shim.yaml"

// DefaultPodProfiles are the profiles a pod may name when the node says
// nothing: deny-all and the development profile. `open` (allow-all),
// profiles installed on the node and profile files are the node's to
// allow (pod_profiles in ConfigFile), like Kata's enable_annotations: the
// pod author is not the node's owner.
var DefaultPodProfiles = []string{"locked", "dev"}

// Config is what the node decides for the pods the shim runs.
type Config struct {
	// PodProfiles lists the profiles the io.smx.profile annotation may
	// name: built-in or installed profile names, matched exactly; "*"
	// admits any name (never a path: a path is admitted only when listed
	// as written). DefaultProfile is always admitted.
	PodProfiles []string `yaml:"pod_profiles"`

	source string // the file it came from or, for the defaults, would
}

// loadConfig reads the node's settings: the file named by the runtime
// options (containerd's runtime option ConfigPath), else ConfigFile in
// the state directory, else the defaults. A named file that is missing or
// does not parse is an error (a node whose settings cannot be read runs
// nothing, rather than something the owner did not decide).
func loadConfig(stateRoot string, opts *ptypes.Any) (*Config, error) {
	path, named := "", false
	if opts != nil && len(opts.GetValue()) > 0 {
		v, err := typeurl.UnmarshalAny(opts)
		if err != nil {
			return nil, fmt.Errorf("smx shim: runtime options: %v: %w", err, errdefs.ErrInvalid)
		}
		if o, ok := v.(*runtimeoptions.Options); ok && o.ConfigPath != "" {
			path, named = o.ConfigPath, true
		}
	}
	if path == "" {
		path = filepath.Join(stateRoot, ConfigFile)
	}
	c := &Config{PodProfiles: DefaultPodProfiles, source: path}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !named {
		return c, nil
	}
	if err != nil {
		return nil, fmt.Errorf("smx shim: read node settings: %w", err)
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	var f Config
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("smx shim: %s: %v: fix the file: %w", path, err, errdefs.ErrInvalid)
	}
	if f.PodProfiles != nil {
		c.PodProfiles = f.PodProfiles
	}
	return c, nil
}

// podProfile is the profile a task's annotations ask for, if the node
// admits it.
func (c *Config) podProfile(annotations map[string]string) (string, error) {
	p := annotations[ProfileAnnotation]
	if p == "" || p == DefaultProfile {
		return DefaultProfile, nil
	}
	if slices.Contains(c.PodProfiles, p) ||
		(slices.Contains(c.PodProfiles, "*") && !strings.ContainsAny(p, "/.")) {
		return p, nil
	}
	allowed := []string{DefaultProfile}
	for _, a := range c.PodProfiles {
		if !slices.Contains(allowed, a) {
			allowed = append(allowed, a)
		}
	}
	return "", fmt.Errorf("smx shim: annotation %s=%q: this node lets pods choose only %s: ask the node's owner to add %q to pod_profiles in %s: %w",
		ProfileAnnotation, p, strings.Join(allowed, ", "), p, c.source, errdefs.ErrDenied)
}
