package lifecycle

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/netpolicy"
	"github.com/spacesandbox/space/internal/sandbox"
)

// CreateRequest is what a client asks for when it creates a sandbox. Zero
// values mean "the server's default".
type CreateRequest struct {
	Template      string                 `json:"template,omitempty"`
	Runtime       string                 `json:"runtime,omitempty"`
	Resources     *sandbox.Resources     `json:"resources,omitempty"`
	Env           map[string]string      `json:"env,omitempty"`
	Metadata      map[string]string      `json:"metadata,omitempty"`
	AutoLifecycle *sandbox.AutoLifecycle `json:"auto_lifecycle,omitempty"`
	Network       *sandbox.Network       `json:"network,omitempty"`
	// Snapshot starts the sandbox from a snapshot instead of booting its
	// template: it gets the snapshot's template, runtime, resources and
	// environment.
	Snapshot string `json:"snapshot,omitempty"`
	// Project is the project the sandbox belongs to (the caller's; "": the
	// default project). It chooses the warm pools a create may claim from.
	Project string `json:"-"`
}

// Limits bound what a create may ask for.
type Limits struct {
	MaxVCPUs     int
	MaxMemoryMiB int
	MaxDiskMiB   int
}

// DefaultLimits are the server's limits unless configured otherwise.
var DefaultLimits = Limits{MaxVCPUs: 8, MaxMemoryMiB: 16384, MaxDiskMiB: 65536}

// DefaultResources are what a sandbox gets when the request names none.
var DefaultResources = sandbox.Resources{VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048}

// DefaultAutoLifecycle is the idle policy a sandbox gets when the request
// names none.
var DefaultAutoLifecycle = sandbox.AutoLifecycle{IdleTimeout: "10m", IdleAction: "none"}

// MaxTimeout bounds a sandbox's timeout.
const MaxTimeout = 30 * 24 * time.Hour

// DefaultTemplate is the template a create uses when it names none.
const DefaultTemplate = "seed:latest"

var (
	envKeyRE   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)
	metaKeyRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,62}$`)
	templateRE = regexp.MustCompile(`^(?:sha256:[0-9a-f]{64}|[a-z0-9][a-z0-9_.\-]{0,62}(?::[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127})?)$`)
	runtimeRE  = regexp.MustCompile(`^[a-z][a-z0-9\-]{0,31}$`)
)

// Normalize checks r against limits and fills in defaults. Every problem is
// an errdefs.InvalidArgument naming the field.
func (r *CreateRequest) Normalize(l Limits) error {
	return r.normalize(l, DefaultAutoLifecycle, netpolicy.EgressNone)
}

func (r *CreateRequest) normalize(l Limits, defaultAL sandbox.AutoLifecycle, defaultEgress string) error {
	bad := func(field, format string, args ...any) error {
		return errdefs.New(errdefs.InvalidArgument, "%s: %s", field, fmt.Sprintf(format, args...)).
			WithDetails(map[string]any{"field": field})
	}
	if r.Template == "" {
		r.Template = DefaultTemplate
	}
	if !templateRE.MatchString(r.Template) {
		return bad("template", "must be name[:tag] or sha256:<64 hex digits>")
	}
	if r.Template != DefaultTemplate && !strings.Contains(r.Template, ":") {
		r.Template += ":latest"
	}
	if r.Runtime != "" && !runtimeRE.MatchString(r.Runtime) {
		return bad("runtime", "malformed runtime name")
	}
	res := DefaultResources
	if r.Resources != nil {
		if r.Resources.VCPUs != 0 {
			res.VCPUs = r.Resources.VCPUs
		}
		if r.Resources.MemoryMiB != 0 {
			res.MemoryMiB = r.Resources.MemoryMiB
		}
		if r.Resources.DiskMiB != 0 {
			res.DiskMiB = r.Resources.DiskMiB
		}
	}
	if res.VCPUs < 1 || res.VCPUs > l.MaxVCPUs {
		return bad("resources.vcpus", "must be between 1 and %d", l.MaxVCPUs)
	}
	if res.MemoryMiB < 128 || res.MemoryMiB > l.MaxMemoryMiB {
		return bad("resources.memory_mib", "must be between 128 and %d", l.MaxMemoryMiB)
	}
	if res.DiskMiB < 256 || res.DiskMiB > l.MaxDiskMiB {
		return bad("resources.disk_mib", "must be between 256 and %d", l.MaxDiskMiB)
	}
	r.Resources = &res
	if len(r.Env) > 256 {
		return bad("env", "at most 256 variables")
	}
	for k, v := range r.Env {
		if !envKeyRE.MatchString(k) {
			return bad("env", "invalid variable name %q", k)
		}
		if len(v) > 32768 || strings.IndexByte(v, 0) >= 0 {
			return bad("env", "value of %s is longer than 32 KiB or contains NUL", k)
		}
	}
	if r.Env == nil {
		r.Env = map[string]string{}
	}
	if len(r.Metadata) > 64 {
		return bad("metadata", "at most 64 entries")
	}
	for k, v := range r.Metadata {
		if !metaKeyRE.MatchString(k) {
			return bad("metadata", "invalid key %q", k)
		}
		if len(v) > 512 {
			return bad("metadata", "value of %s is longer than 512 bytes", k)
		}
	}
	if r.Metadata == nil {
		r.Metadata = map[string]string{}
	}
	al := defaultAL
	if r.AutoLifecycle != nil {
		if r.AutoLifecycle.IdleTimeout != "" {
			al.IdleTimeout = r.AutoLifecycle.IdleTimeout
		}
		if r.AutoLifecycle.IdleAction != "" {
			al.IdleAction = r.AutoLifecycle.IdleAction
		}
		if r.AutoLifecycle.Timeout != "" {
			al.Timeout = r.AutoLifecycle.Timeout
		}
		if r.AutoLifecycle.TimeoutAction != "" {
			al.TimeoutAction = r.AutoLifecycle.TimeoutAction
		}
	}
	if al.Timeout != "" {
		if d, err := time.ParseDuration(al.Timeout); err != nil || d < 0 || d > MaxTimeout {
			return bad("auto_lifecycle.timeout", "must be a duration between 0s (none) and 720h, like \"5m\"")
		} else if d == 0 {
			al.Timeout = ""
		}
	}
	switch al.TimeoutAction {
	case "":
		if al.Timeout != "" {
			al.TimeoutAction = "delete"
		}
	case "delete", "suspend":
	default:
		return bad("auto_lifecycle.timeout_action", "must be delete or suspend")
	}
	d, err := time.ParseDuration(al.IdleTimeout)
	if err != nil || d < time.Second || d > 30*24*time.Hour {
		return bad("auto_lifecycle.idle_timeout", "must be a duration between 1s and 720h, like \"10m\"")
	}
	switch al.IdleAction {
	case "pause", "suspend", "none":
	default:
		return bad("auto_lifecycle.idle_action", "must be pause, suspend or none")
	}
	r.AutoLifecycle = &al
	if r.Network == nil {
		r.Network = &sandbox.Network{}
	}
	if r.Network.IngressToken != "" {
		return bad("network.ingress_token", "is read-only")
	}
	if defaultEgress == "" {
		defaultEgress = netpolicy.EgressNone
	}
	if err := NormalizeNetwork(r.Network, defaultEgress); err != nil {
		return err
	}
	return nil
}

// NormalizeNetwork fills in a network policy's defaults and validates it;
// a problem is an errdefs.InvalidArgument naming the field.
func NormalizeNetwork(n *sandbox.Network, defaultEgress string) error {
	if err := netpolicy.Normalize(n, defaultEgress); err != nil {
		var fe *netpolicy.FieldError
		if errors.As(err, &fe) {
			return errdefs.New(errdefs.InvalidArgument, "%s", fe.Error()).WithDetails(map[string]any{"field": fe.Field})
		}
		return errdefs.New(errdefs.InvalidArgument, "network: %v", err)
	}
	return nil
}
