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
	"github.com/google/go-containerregistry/pkg/name"
	"go.yaml.in/yaml/v3"

	"github.com/smx-dev/smx/internal/errdefs"
	"github.com/smx-dev/smx/internal/ocisnap"
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
	// PodRestoreFrom lists where the io.smx.from-snapshot and
	// io.smx.from-template annotations may point: registry host and repository prefixes (REGISTRY[/PATH]),
	// matched whole path components at a time against the reference's
	// repository. Empty (the default): no pod restores from a registry.
	PodRestoreFrom []string `yaml:"pod_restore_from"`
	// PodRestoreKeys are the keys an artifact a pod restores from must be
	// signed by: verifier keys (NAME+HASH+KEY, as `smx logs export-key`
	// prints them) or absolute paths of files of them, one per line as
	// in trusted-log-keys. Only these are trusted for pods.
	PodRestoreKeys []string `yaml:"pod_restore_keys"`

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
	for _, p := range f.PodRestoreFrom {
		r, err := restorePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("smx shim: %s: pod_restore_from: %v: fix the file: %w", path, err, errdefs.ErrInvalid)
		}
		c.PodRestoreFrom = append(c.PodRestoreFrom, r)
	}
	for _, k := range f.PodRestoreKeys {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if strings.HasPrefix(k, "/") {
			c.PodRestoreKeys = append(c.PodRestoreKeys, k)
			continue
		}
		if _, _, err := ocisnap.Verifiers(k); err != nil {
			return nil, fmt.Errorf("smx shim: %s: pod_restore_keys: %v: fix the file: %w", path, err, errdefs.ErrInvalid)
		}
		c.PodRestoreKeys = append(c.PodRestoreKeys, k)
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

// restorePrefix is a pod_restore_from entry as the references it admits
// spell their repositories: REGISTRY[/PATH], the registry host always
// named (a bare "team/agents" would otherwise be read as Docker Hub's),
// docker.io as the library spells it, no tag or digest.
func restorePrefix(p string) (string, error) {
	p = strings.TrimSuffix(strings.TrimSpace(p), "/")
	host, path, _ := strings.Cut(p, "/")
	if host == "" || !(strings.ContainsAny(host, ".:") || host == "localhost") {
		return "", fmt.Errorf("%q does not start with a registry host (REGISTRY[/PATH], e.g. registry.example.com/agents)", p)
	}
	if strings.ContainsAny(path, "@:") {
		return "", fmt.Errorf("%q names a tag or digest: list a registry or repository prefix", p)
	}
	reg, err := name.NewRegistry(host)
	if err != nil {
		return "", fmt.Errorf("%q: %v", p, err)
	}
	out := reg.RegistryStr()
	if path != "" {
		repo, err := name.NewRepository(out + "/" + path)
		if err != nil {
			return "", fmt.Errorf("%q: %v", p, err)
		}
		out += "/" + repo.RepositoryStr()
	}
	return out, nil
}

// restoreRef is the artifact a task's annotation names for its VM to
// start from (FromSnapshotAnnotation: restored from that snapshot;
// FromTemplateAnnotation: booted the normal way, its first start
// restoring that template), if the node admits it: its registry and
// repository under one of PodRestoreFrom's prefixes, whole path
// components (a prefix registry.example.com/team admits
// registry.example.com/team/x, not registry.example.com/team-b/x), and
// some key to check it against. A task may name one artifact, not both.
// It returns a nil reference when neither annotation is present.
func (c *Config) restoreRef(annotations map[string]string) (sourceKind, name.Reference, error) {
	snap, isSnap := annotations[FromSnapshotAnnotation]
	tpl, isTpl := annotations[FromTemplateAnnotation]
	kind, key, v := fromSnapshot, FromSnapshotAnnotation, snap
	switch {
	case isSnap && isTpl:
		return 0, nil, fmt.Errorf("smx shim: annotations %s and %s: a pod starts from a snapshot or from a template, not both: drop one: %w",
			FromSnapshotAnnotation, FromTemplateAnnotation, errdefs.ErrInvalid)
	case isTpl:
		kind, key, v = fromTemplate, FromTemplateAnnotation, tpl
	case !isSnap:
		return 0, nil, nil
	}
	ref, err := name.ParseReference(v)
	if err != nil {
		return 0, nil, fmt.Errorf("smx shim: annotation %s=%q is not an image reference (REGISTRY/REPO:TAG or @sha256:...): %v: %w", key, v, err, errdefs.ErrInvalid)
	}
	repo := ref.Context().RegistryStr() + "/" + ref.Context().RepositoryStr()
	allowed := false
	for _, p := range c.PodRestoreFrom {
		if repo == p || strings.HasPrefix(repo, p+"/") {
			allowed = true
			break
		}
	}
	if !allowed {
		if len(c.PodRestoreFrom) == 0 {
			return 0, nil, fmt.Errorf("smx shim: annotation %s=%q: this node lets no pod restore from a registry: ask the node's owner to add the repository to pod_restore_from in %s: %w",
				key, v, c.source, errdefs.ErrDenied)
		}
		return 0, nil, fmt.Errorf("smx shim: annotation %s=%q: this node lets pods restore only from %s: ask the node's owner to add %q to pod_restore_from in %s: %w",
			key, v, strings.Join(c.PodRestoreFrom, ", "), repo, c.source, errdefs.ErrDenied)
	}
	if len(c.PodRestoreKeys) == 0 {
		return 0, nil, fmt.Errorf("smx shim: annotation %s=%q: this node trusts no signing key for pods: ask the node's owner to add the sending host's key (`smx logs export-key` there) to pod_restore_keys in %s: %w",
			key, v, c.source, errdefs.ErrDenied)
	}
	return kind, ref, nil
}

// restoreKeys are the verifier key texts pods' artifacts are checked
// against: the listed keys, and the files' contents.
func (c *Config) restoreKeys() ([]string, error) {
	var out []string
	for _, k := range c.PodRestoreKeys {
		if !strings.HasPrefix(k, "/") {
			out = append(out, k)
			continue
		}
		b, err := os.ReadFile(k)
		if err != nil {
			return nil, fmt.Errorf("smx shim: pod_restore_keys in %s: %w", c.source, err)
		}
		out = append(out, string(b))
	}
	return out, nil
}
