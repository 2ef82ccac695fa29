package sandboxio

import (
	"context"
	"net/netip"
	"time"

	"github.com/spacesandbox/space/internal/agent/proto"
)

// Identity is what makes a sandbox itself after a boot or a restore: its
// hostname (on create), the host's clock, its network, and fresh entropy so
// copies of one snapshot never share RNG state.
type Identity struct {
	Hostname string    // "": unchanged
	Now      time.Time // sets the wall clock
	// Address, Gateway and DNS configure the network (Address invalid: none).
	Address      netip.Prefix
	Gateway, DNS netip.Addr
	// NetworkGiven says the runtime gave the link Address and its route
	// when it booted the sandbox: only the resolver is left to set.
	NetworkGiven bool
	Entropy      []byte // mixed into the kernel's pool
	// CPUs is the sandbox's vCPUs, what the processes it runs see (their
	// CPU affinity) where the kernel shows more (gVisor shows at least 2).
	CPUs int
}

// Configure gives the sandbox its identity.
func (a *Agent) Configure(ctx context.Context, id Identity) error {
	cfg := proto.Configure{Hostname: id.Hostname, UnixNano: id.Now.UnixNano(), CPUs: id.CPUs}
	if id.Address.IsValid() {
		cfg.Network = &proto.NetConfig{Address: id.Address.String(), Gateway: id.Gateway.String(), DNS: id.DNS.String(), Given: id.NetworkGiven}
	}
	_, err := a.c.Configure(ctx, cfg, id.Entropy)
	return a.fail("configure", err)
}

// Metrics is a sandbox's use of CPU, memory and disk as the sandbox itself
// accounts it (what E2B's envd reports); memory and disk in bytes.
type Metrics struct {
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"` // busy share of all CPUs since the previous sample, 0–100
	MemTotal   uint64  `json:"mem_total"`
	MemUsed    uint64  `json:"mem_used"`
	MemCache   uint64  `json:"mem_cache"`
	DiskTotal  uint64  `json:"disk_total"`
	DiskUsed   uint64  `json:"disk_used"`
	AgentRSS   uint64  `json:"agent_rss"` // the agent's own resident memory, part of MemUsed (0: an agent too old to say)
}

// Metrics samples the sandbox's use of CPU, memory and disk. The CPU share
// is since the previous call by anyone: one sampler should call it.
func (a *Agent) Metrics(ctx context.Context) (Metrics, error) {
	m, err := a.c.Metrics(ctx)
	return Metrics(m), a.fail("read metrics", err)
}
