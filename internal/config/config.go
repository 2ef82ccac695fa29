// Package config is the typed configuration of `space serve`: every setting
// is a flag and, with the SPACE_ prefix, an environment variable; Validate
// checks the whole before anything starts.
package config

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/blobstore"
	"github.com/spacesandbox/space/internal/store/postgres"
)

// Serve configures `space serve`.
type Serve struct {
	DataDir string
	// Store is where durable state lives: empty for SQLite in DataDir, or
	// a postgres:// URL.
	Store string
	// BlobStore, when set (s3://…), keeps suspend snapshots in object
	// storage too.
	BlobStore     string
	APIAddr       string
	DataPlaneAddr string
	// DataPlaneURL is the data plane's URL as clients reach it; empty means
	// derived from DataPlaneAddr.
	DataPlaneURL string
	// ECWAddr is the E2B-compatible layer's listen address ("" = off).
	ECWAddr   string
	TLSCert   string
	TLSKey    string
	Runtime   string // auto, vm, gvisor (and fake in test builds)
	LogFormat string // auto, text, json
	LogLevel  string // debug, info, warn, error
	// HeaderTimeout bounds how long a request's headers may take,
	// BodyIdle how long its body may stop arriving, and MaxConnections the
	// connections open at once on each listener (authenticated streams do
	// not count).
	HeaderTimeout  time.Duration
	BodyIdle       time.Duration
	MaxConnections int
	// ShutdownGrace bounds how long a graceful shutdown waits for requests
	// and operations in flight.
	ShutdownGrace time.Duration
	// OperationTimeout bounds one lifecycle operation.
	OperationTimeout time.Duration
	// MaxSandboxes caps active sandboxes (0 = no cap).
	MaxSandboxes int
	// TemplateCacheMiB caps the node's copies of templates the blob store
	// holds (0 = no cap).
	TemplateCacheMiB int
	// AttachTokenTTL is how long an attachment token is valid.
	AttachTokenTTL time.Duration
	// Runsc is the runsc binary ("" = from PATH).
	Runsc string
	// QEMU, VMKernel and VMModules are the vm runtime's QEMU binary, guest
	// kernel and its module tree; VMAccel is kvm, tcg or auto.
	QEMU      string
	VMKernel  string
	VMModules string
	VMAccel   string
	// AgentBin is the static space-agent binary ("" = beside space, or PATH).
	AgentBin string
	// BuildSeed builds seed:latest on start when it is missing.
	BuildSeed bool
	// WarmPools are default warm-pool sizes, "name:tag=N,…", for templates
	// no one set a pool for through the API.
	WarmPools string
	// IdleTimeout and IdleAction are the default idle policy of sandboxes
	// that name none; SuspendPausedAfter suspends long-paused ones.
	IdleTimeout        time.Duration
	IdleAction         string
	SuspendPausedAfter time.Duration
	// MetricsInterval is how often each running sandbox's CPU, memory and
	// disk use is sampled (0: never).
	MetricsInterval time.Duration
	// SandboxNetwork is the sandboxes' address range ("off": sandboxes
	// get no network at all).
	SandboxNetwork string
	// EgressUplink and EgressGateway are the link sandbox traffic leaves by
	// and its next hop ("": the host's default route); EgressDNS the
	// upstream resolver ("": the host's).
	EgressUplink  string
	EgressGateway string
	EgressDNS     string
	// DefaultEgress is the egress of sandboxes that name none.
	DefaultEgress string
	// EgressAllowPrivate are private ranges sandboxes may reach (CIDRs,
	// comma-separated), taken off the floor.
	EgressAllowPrivate string
	// SandboxDomain is the domain of sandbox host names
	// ({port}-{id}.{domain}) the data plane routes to sandbox ports.
	SandboxDomain string

	// Role is what this process does: all (a single machine), control
	// (API, placement, sweeps; no sandboxes) or node (runs sandboxes).
	Role string
	// ClusterKey authenticates the cluster's own calls and derives the key
	// every member signs tokens with (control and node roles).
	ClusterKey string
	// NodeName names a node (default: the host name); NodeURL is where
	// control replicas reach its API listener and ECWURL its E2B listener
	// (default: from the listen addresses); NodeLabels are its labels
	// (k=v,…).
	NodeName   string
	NodeURL    string
	ECWURL     string
	NodeLabels string
	// Heartbeat is how often a cluster member says it is alive;
	// NodeLostAfter how long a node may be silent before it is lost.
	Heartbeat     time.Duration
	NodeLostAfter time.Duration
	// MemoryOvercommit is how much sandbox memory a node offers per byte
	// of its own (1: none; sandboxes rarely use all they may).
	MemoryOvercommit float64
	// AllowPlainHTTP serves plain HTTP on addresses beyond loopback (behind
	// a TLS-terminating proxy, or on a pod network that encrypts).
	AllowPlainHTTP bool
	// ProxyDataPlane, on a control replica, makes attach URLs name its own
	// data plane, which forwards each stream to the node (for clients
	// that cannot reach nodes).
	ProxyDataPlane bool
	// Console serves the web console at /console/ on the API listener.
	Console bool
}

// The roles of `space serve`.
const (
	RoleAll     = "all"
	RoleControl = "control"
	RoleNode    = "node"
)

// Where the vm runtime finds QEMU and its guest by default (`make deps`
// installs them there); `space bench --baseline` starts its bare VM with
// the same defaults.
const (
	DefaultQEMU      = "qemu-system-x86_64"
	DefaultVMKernel  = "/usr/local/lib/space/guest/vmlinuz"
	DefaultVMModules = "/usr/local/lib/space/guest/modules"
)

// Clustered says whether this process is one of several (control or node).
func (s *Serve) Clustered() bool { return s.Role == RoleControl || s.Role == RoleNode }

// Labels parses --node-labels.
func (s *Serve) Labels() (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(s.NodeLabels, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		if !ok || k == "" || len(k) > 63 || len(v) > 63 {
			return nil, fmt.Errorf("--node-labels %q: want key=value (each at most 63 characters), comma-separated", item)
		}
		out[k] = v
	}
	return out, nil
}

// Flags registers s's fields on fs, with defaults taken from the
// environment (SPACE_DATA_DIR, SPACE_API_ADDR, …) where set.
func (s *Serve) Flags(fs *flag.FlagSet) {
	str := func(p *string, name, def, usage string) {
		fs.StringVar(p, name, envOr(name, def), usage+" (env "+EnvName(name)+")")
	}
	dur := func(p *time.Duration, name string, def time.Duration, usage string) {
		if v, ok := os.LookupEnv(EnvName(name)); ok {
			if d, err := time.ParseDuration(v); err == nil {
				def = d
			}
		}
		fs.DurationVar(p, name, def, usage+" (env "+EnvName(name)+")")
	}
	num := func(p *int, name string, def int, usage string) {
		if v, ok := os.LookupEnv(EnvName(name)); ok {
			fmt.Sscan(v, &def)
		}
		fs.IntVar(p, name, def, usage+" (env "+EnvName(name)+")")
	}
	str(&s.DataDir, "data-dir", "/var/lib/space", "directory for the database, templates, snapshots and the first API token")
	SecretVar(fs, &s.Store, "store", EnvName("store"), "database: empty for SQLite in the data directory, or a postgres://user@host:port/db?sslmode=… `URL` (password from PGPASSWORD or ~/.pgpass, or in the URL; never logged or shown)")
	str(&s.BlobStore, "blob-store", "", "object storage for suspend snapshots, gVisor named snapshots and templates: empty for the data directory only, or s3://bucket/prefix?endpoint=http(s)://host:port&region=r (credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or ~/.aws/credentials)")
	str(&s.APIAddr, "api-addr", "127.0.0.1:8080", "control-plane listen address")
	str(&s.DataPlaneAddr, "data-plane-addr", "127.0.0.1:8090", "data-plane (command streams) listen address")
	str(&s.ECWAddr, "ecw-addr", "127.0.0.1:3000", "E2B-compatible API listen address (E2B REST + envd); empty turns it off")
	str(&s.DataPlaneURL, "data-plane-url", "", "data-plane URL as clients reach it, put in attach URLs (default: from --data-plane-addr)")
	str(&s.TLSCert, "tls-cert", "", "TLS certificate file (required to listen beyond loopback)")
	str(&s.TLSKey, "tls-key", "", "TLS private key file")
	str(&s.Runtime, "runtime", "auto", "sandbox runtime: auto, vm or gvisor")
	str(&s.Runsc, "runsc", "", "runsc binary for the gvisor runtime (default: from PATH)")
	str(&s.QEMU, "qemu", DefaultQEMU, "QEMU binary for the vm runtime")
	str(&s.VMKernel, "vm-kernel", DefaultVMKernel, "guest kernel of the vm runtime (make deps unpacks Debian's cloud kernel there)")
	str(&s.VMModules, "vm-modules", DefaultVMModules, "the guest kernel's module tree")
	str(&s.VMAccel, "vm-accel", "auto", "vm acceleration: auto (kvm where a probe guest boots, else tcg), kvm or tcg")
	str(&s.AgentBin, "agent-bin", "", "static space-agent binary (default: beside the space binary, else from PATH)")
	fs.BoolVar(&s.AllowPlainHTTP, "allow-plain-http", os.Getenv(EnvName("allow-plain-http")) == "true", "serve plain HTTP beyond loopback: only behind a TLS-terminating proxy or on a network that encrypts (tokens cross it in clear) (env "+EnvName("allow-plain-http")+")")
	fs.BoolVar(&s.Console, "console", os.Getenv(EnvName("console")) != "false", "serve the web console at /console/ on the API listener (env "+EnvName("console")+"=false turns it off)")
	fs.BoolVar(&s.ProxyDataPlane, "proxy-data-plane", os.Getenv(EnvName("proxy-data-plane")) == "true", "control role: attach URLs name this replica's data plane (--data-plane-url), which forwards each command stream to its node — for clients that cannot reach the nodes (env "+EnvName("proxy-data-plane")+")")
	buildSeed := os.Getenv(EnvName("build-seed")) != "false"
	fs.BoolVar(&s.BuildSeed, "build-seed", buildSeed, "build the seed:latest template on start when it is missing (env "+EnvName("build-seed")+")")
	str(&s.LogFormat, "log-format", "auto", "log format: auto (text on a terminal, else json), text or json")
	str(&s.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	num(&s.MaxSandboxes, "max-sandboxes", 1000, "most sandboxes active at once; 0 for no cap")
	num(&s.TemplateCacheMiB, "template-cache-mib", 0, "with --blob-store: most MiB of templates kept on this node; the least recently used ones no sandbox uses are dropped (fetched again when needed); 0 for no cap")
	dur(&s.ShutdownGrace, "shutdown-grace", 30*time.Second, "how long shutdown waits for requests and operations in flight")
	dur(&s.HeaderTimeout, "header-timeout", 10*time.Second, "longest a request's headers may take to arrive")
	dur(&s.BodyIdle, "body-idle-timeout", 30*time.Second, "longest a request body may stop arriving before the request ends")
	num(&s.MaxConnections, "max-connections", 4096, "most connections open at once on each listener, authenticated streams aside; 0 for no cap")
	dur(&s.OperationTimeout, "operation-timeout", 10*time.Minute, "upper bound of one lifecycle operation")
	str(&s.WarmPools, "warm-pools", "", "default warm pools, like \"seed:latest=2,test:latest=1\" (PUT /v1/warm-pools overrides)")
	dur(&s.IdleTimeout, "idle-timeout", 10*time.Minute, "default idle timeout of sandboxes that name none")
	str(&s.IdleAction, "idle-action", "none", "default idle action: none, pause or suspend")
	dur(&s.SuspendPausedAfter, "suspend-paused-after", 0, "suspend sandboxes paused longer than this (0: never)")
	dur(&s.MetricsInterval, "metrics-interval", 5*time.Second, "how often each running sandbox's CPU, memory and disk use is sampled for its metrics (0: never)")
	dur(&s.AttachTokenTTL, "attach-token-ttl", 24*time.Hour, "how long a command session's attachment token is valid")
	str(&s.SandboxNetwork, "sandbox-network", "10.209.0.0/16", "sandboxes' address range (a /30 each), or \"off\" for sandboxes without any network")
	str(&s.EgressUplink, "egress-uplink", "", "link sandbox traffic leaves by (default: the host's default route's)")
	str(&s.EgressGateway, "egress-gateway", "", "next hop on the uplink (default: the default route's gateway)")
	str(&s.EgressDNS, "egress-dns", "", "upstream resolver ADDR:PORT the sandboxes' resolver forwards allowed names to (default: the host's first nameserver)")
	str(&s.DefaultEgress, "default-egress", "public", "egress of sandboxes whose create names none: public or none")
	str(&s.EgressAllowPrivate, "egress-allow-private", "", "private ranges sandboxes may reach despite the floor, like \"10.1.2.0/24\" (comma-separated)")
	str(&s.Role, "role", RoleAll, "what this process does: all (one machine), control (API and scheduling for cluster nodes; several behind a load balancer) or node (runs sandboxes for the control replicas)")
	SecretVar(fs, &s.ClusterKey, "cluster-key", EnvName("cluster-key"), "shared `secret` of a cluster's members (control and node roles; at least 16 characters; never logged or shown)")
	str(&s.NodeName, "node-name", "", "this node's name in the cluster (default: the host name)")
	str(&s.NodeURL, "node-url", "", "where control replicas reach this node's API listener (default: from --api-addr)")
	str(&s.ECWURL, "ecw-url", "", "where control replicas reach this node's E2B listener (default: from --ecw-addr)")
	str(&s.NodeLabels, "node-labels", "", "this node's labels, like \"zone=a,disk=ssd\"")
	ovc := 1.0
	if v, ok := os.LookupEnv(EnvName("memory-overcommit")); ok {
		fmt.Sscan(v, &ovc)
	}
	fs.Float64Var(&s.MemoryOvercommit, "memory-overcommit", ovc, "sandbox memory a node offers per byte of its own, for placement: 1 reserves every sandbox's whole limit; 2 places twice as much (env "+EnvName("memory-overcommit")+")")
	dur(&s.Heartbeat, "heartbeat", time.Second, "how often a cluster member records that it is alive")
	dur(&s.NodeLostAfter, "node-lost-after", 10*time.Second, "how long a cluster member may stay silent before it counts as lost (its running sandboxes fail with node_lost)")
	str(&s.SandboxDomain, "sandbox-domain", "", "domain of sandbox port host names {port}-{id}.{domain} served by the data plane (default: localhost:<data-plane port>)")
}

// OpenPrivate parses --egress-allow-private.
func (s *Serve) OpenPrivate() ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s.EgressAllowPrivate, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("--egress-allow-private: %v", err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// SecretVar registers a string flag that may hold a secret: its value is
// taken from the environment variable env when set, and -h never shows it
// (a flag's default is printed in its usage, and usage ends up in logs).
func SecretVar(fs *flag.FlagSet, p *string, name, env, usage string) {
	if v, ok := os.LookupEnv(env); ok {
		*p = v
	}
	fs.Var(secretValue{p}, name, usage+" (env "+env+")")
}

// secretValue is a flag.Value that never prints what it holds.
type secretValue struct{ p *string }

func (secretValue) String() string       { return "" }
func (s secretValue) Set(v string) error { *s.p = v; return nil }

// EnvName is the environment variable of a flag: data-dir → SPACE_DATA_DIR.
func EnvName(flagName string) string {
	return "SPACE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func envOr(flagName, def string) string {
	if v, ok := os.LookupEnv(EnvName(flagName)); ok {
		return v
	}
	return def
}

// Validate checks the configuration as a whole.
func (s *Serve) Validate() error {
	var errs []error
	if s.DataDir == "" {
		errs = append(errs, errors.New("--data-dir must not be empty"))
	}
	if s.Store != "" && !postgres.IsURL(s.Store) {
		errs = append(errs, errors.New("--store must be empty (SQLite in the data directory) or a postgres:// URL"))
	}
	switch s.Role {
	case RoleAll:
	case RoleControl, RoleNode:
		if !postgres.IsURL(s.Store) || s.BlobStore == "" {
			errs = append(errs, fmt.Errorf("--role %s needs the cluster's shared state: --store postgres://… and --blob-store s3://…", s.Role))
		}
		if len(s.ClusterKey) < 16 {
			errs = append(errs, fmt.Errorf("--role %s needs --cluster-key (at least 16 characters), the same on every member", s.Role))
		}
		if s.Heartbeat < 100*time.Millisecond || s.NodeLostAfter < 3*s.Heartbeat {
			errs = append(errs, errors.New("--heartbeat must be at least 100ms and --node-lost-after at least three heartbeats"))
		}
	default:
		errs = append(errs, fmt.Errorf("--role %q: want all, control or node", s.Role))
	}
	if s.ProxyDataPlane && s.Role != RoleControl {
		errs = append(errs, errors.New("--proxy-data-plane is for --role control"))
	}
	if s.MemoryOvercommit < 0.1 || s.MemoryOvercommit > 20 {
		errs = append(errs, errors.New("--memory-overcommit must be between 0.1 and 20"))
	}
	if _, err := s.Labels(); err != nil {
		errs = append(errs, err)
	}
	if s.TemplateCacheMiB < 0 {
		errs = append(errs, errors.New("--template-cache-mib must not be negative"))
	}
	if s.BlobStore != "" && !blobstore.IsURL(s.BlobStore) {
		errs = append(errs, errors.New("--blob-store must be empty or an s3:// URL"))
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key must be given together"))
	}
	switch s.DefaultEgress {
	case "public", "none":
	default:
		errs = append(errs, errors.New("--default-egress must be public or none"))
	}
	if s.SandboxNetwork != "off" {
		if _, err := netip.ParsePrefix(s.SandboxNetwork); err != nil {
			errs = append(errs, fmt.Errorf("--sandbox-network: %v", err))
		}
	}
	if s.EgressGateway != "" {
		if _, err := netip.ParseAddr(s.EgressGateway); err != nil {
			errs = append(errs, fmt.Errorf("--egress-gateway: %v", err))
		}
	}
	if s.EgressDNS != "" {
		if _, err := netip.ParseAddrPort(s.EgressDNS); err != nil {
			errs = append(errs, fmt.Errorf("--egress-dns must be ADDR:PORT: %v", err))
		}
	}
	if _, err := s.OpenPrivate(); err != nil {
		errs = append(errs, err)
	}
	addrs := map[string]string{"--api-addr": s.APIAddr, "--data-plane-addr": s.DataPlaneAddr}
	if s.ECWAddr != "" {
		addrs["--ecw-addr"] = s.ECWAddr
	}
	for name, addr := range addrs {
		loop, err := Loopback(addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		if !loop && s.TLSCert == "" && !s.AllowPlainHTTP {
			errs = append(errs, fmt.Errorf("%s %s is not a loopback address: plain HTTP is only allowed on loopback; give --tls-cert and --tls-key (or --allow-plain-http behind a TLS-terminating proxy)", name, addr))
		}
	}
	if _, err := s.WarmPoolSizes(); err != nil {
		errs = append(errs, err)
	}
	switch s.VMAccel {
	case "auto", "kvm", "tcg":
	default:
		errs = append(errs, fmt.Errorf("--vm-accel %q: want auto, kvm or tcg", s.VMAccel))
	}
	switch s.LogFormat {
	case "auto", "text", "json":
	default:
		errs = append(errs, fmt.Errorf("--log-format %q: want auto, text or json", s.LogFormat))
	}
	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("--log-level %q: want debug, info, warn or error", s.LogLevel))
	}
	if s.MaxSandboxes < 0 {
		errs = append(errs, errors.New("--max-sandboxes must be ≥ 0"))
	}
	switch s.IdleAction {
	case "none", "pause", "suspend":
	default:
		errs = append(errs, fmt.Errorf("--idle-action %q: want none, pause or suspend", s.IdleAction))
	}
	if s.IdleTimeout < time.Second || s.SuspendPausedAfter < 0 {
		errs = append(errs, errors.New("--idle-timeout must be at least 1s and --suspend-paused-after not negative"))
	}
	if s.MetricsInterval != 0 && s.MetricsInterval < 500*time.Millisecond {
		errs = append(errs, errors.New("--metrics-interval must be 0 (off) or at least 500ms"))
	}
	if s.AttachTokenTTL < time.Second {
		errs = append(errs, errors.New("--attach-token-ttl must be at least 1s"))
	}
	if s.HeaderTimeout <= 0 || s.BodyIdle <= 0 || s.MaxConnections < 0 {
		return errors.New("--header-timeout and --body-idle-timeout must be positive, --max-connections not negative")
	}
	if s.ShutdownGrace < 0 || s.OperationTimeout <= 0 {
		errs = append(errs, errors.New("--shutdown-grace must be ≥ 0 and --operation-timeout > 0"))
	}
	return errors.Join(errs...)
}

// TLS reports whether the listeners serve TLS.
func (s *Serve) TLS() bool { return s.TLSCert != "" }

// Loopback reports whether a listen address binds only loopback. A host name
// other than localhost, or an empty host (all interfaces), is not loopback.
func Loopback(addr string) (bool, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false, fmt.Errorf("address %q: %w", addr, err)
	}
	if port == "" {
		return false, fmt.Errorf("address %q has no port", addr)
	}
	if host == "localhost" {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
}

// WarmPoolSizes parses --warm-pools.
func (s *Serve) WarmPoolSizes() (map[string]int, error) {
	out := map[string]int{}
	if strings.TrimSpace(s.WarmPools) == "" {
		return out, nil
	}
	for _, item := range strings.Split(s.WarmPools, ",") {
		ref, n, ok := strings.Cut(strings.TrimSpace(item), "=")
		var size int
		if _, err := fmt.Sscan(n, &size); !ok || err != nil || ref == "" || size < 0 || size > 100 {
			return nil, fmt.Errorf("--warm-pools %q: want name:tag=N (0 to 100), comma-separated", item)
		}
		if !strings.Contains(ref, ":") {
			ref += ":latest"
		}
		out[ref] = size
	}
	return out, nil
}
