// Package usage samples every running sandbox's use of CPU, memory and disk
// at a fixed interval and keeps a bounded series per sandbox: what E2B's
// getMetrics and SPACE's GET /v1/sandboxes/{id}/metrics answer, and the
// fleet totals /metrics exports.
package usage

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/sandboxio"
	"github.com/spacesandbox/space/internal/store"
)

// Sample is one reading of a sandbox.
type Sample struct {
	At time.Time `json:"timestamp"`
	sandboxio.Metrics
}

// Sandboxes lists the sandboxes to sample.
type Sandboxes interface {
	List(ctx context.Context, q store.SandboxQuery) (store.Page[sandbox.Sandbox], error)
}

// Agents reaches a running sandbox's agent without counting as activity
// (sampling must not keep a sandbox from going idle).
type Agents interface {
	PeekAgent(ctx context.Context, sandboxID string) (*sandboxio.Agent, *sandbox.Sandbox, error)
}

// Config sets up a Sampler.
type Config struct {
	Sandboxes Sandboxes
	Agents    Agents
	Logger    *slog.Logger
	// Every is the sampling interval (default 5 s, as E2B samples); Keep
	// how long a sandbox's samples are kept (default 1 h). A sandbox not
	// sampled for Keep (deleted, or stopped that long) loses its series.
	Every, Keep time.Duration
	// Parallel bounds the agents asked at once (default 8).
	Parallel int
	// Node, in a cluster, is the node whose sandboxes are sampled (the
	// others run elsewhere).
	Node *string
	// AgentWarn is the agent resident memory above which a sandbox's
	// sample is logged as a warning, once until it falls below (default
	// 128 MiB: an agent idles at about 20 MiB and its output buffers are
	// bounded well below this; more means a leak, which takes the memory
	// from the sandbox's own processes).
	AgentWarn uint64
}

// Sampler keeps the series.
type Sampler struct {
	cfg Config

	mu     sync.Mutex // guards series and warned
	series map[string][]Sample
	warned map[string]bool // sandboxes whose agent is above AgentWarn
}

// New returns a sampler; Run starts it.
func New(cfg Config) *Sampler {
	if cfg.Every <= 0 {
		cfg.Every = 5 * time.Second
	}
	if cfg.Keep <= 0 {
		cfg.Keep = time.Hour
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 8
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.AgentWarn == 0 {
		cfg.AgentWarn = 128 << 20
	}
	return &Sampler{cfg: cfg, series: map[string][]Sample{}, warned: map[string]bool{}}
}

// Run samples every running sandbox each interval until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Every)
	defer t.Stop()
	for {
		s.SampleAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SampleAll takes one sample of every running sandbox now.
func (s *Sampler) SampleAll(ctx context.Context) {
	var ids []string
	q := store.SandboxQuery{State: sandbox.Running, Limit: store.MaxLimit, Node: s.cfg.Node}
	for {
		page, err := s.cfg.Sandboxes.List(ctx, q)
		if err != nil {
			if ctx.Err() == nil {
				s.cfg.Logger.Warn("usage: list running sandboxes failed", "err", err)
			}
			return
		}
		for _, sb := range page.Items {
			ids = append(ids, sb.ID)
		}
		if page.Next == "" {
			break
		}
		q.Cursor = page.Next
	}
	sem := make(chan struct{}, s.cfg.Parallel)
	var wg sync.WaitGroup
	for _, id := range ids {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			s.sample(ctx, id)
		}()
	}
	wg.Wait()
	s.forget(time.Now())
}

func (s *Sampler) sample(ctx context.Context, id string) {
	ctx, cancel := context.WithTimeout(ctx, min(s.cfg.Every, 5*time.Second))
	defer cancel()
	ag, _, err := s.cfg.Agents.PeekAgent(ctx, id)
	if err != nil {
		return // stopped meanwhile
	}
	m, err := ag.Metrics(ctx)
	if err != nil {
		s.cfg.Logger.Debug("usage: sample failed", "sandbox_id", id, "err", err)
		return
	}
	now := time.Now().UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	if over := m.AgentRSS > s.cfg.AgentWarn; over != s.warned[id] {
		s.warned[id] = over
		if over {
			s.cfg.Logger.Warn("usage: a sandbox's agent holds more memory than it should", "sandbox_id", id, "agent_rss", m.AgentRSS, "mem_used", m.MemUsed, "mem_total", m.MemTotal)
		}
	}
	ser := append(s.series[id], Sample{At: now, Metrics: m})
	// Drop what is older than Keep (the series is in time order).
	i := 0
	for i < len(ser) && now.Sub(ser[i].At) > s.cfg.Keep {
		i++
	}
	s.series[id] = ser[i:]
}

// forget drops the series of sandboxes not sampled for Keep.
func (s *Sampler) forget(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, ser := range s.series {
		if len(ser) == 0 || now.Sub(ser[len(ser)-1].At) > s.cfg.Keep {
			delete(s.series, id)
			delete(s.warned, id)
		}
	}
}

// Series returns a sandbox's samples taken in [from, to] (zero: unbounded),
// oldest first.
func (s *Sampler) Series(id string, from, to time.Time) []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Sample{}
	for _, x := range s.series[id] {
		if (!from.IsZero() && x.At.Before(from)) || (!to.IsZero() && x.At.After(to)) {
			continue
		}
		out = append(out, x)
	}
	return out
}

// Totals is the fleet's use in the latest sample of each sandbox sampled
// within two intervals.
type Totals struct {
	Sandboxes           int
	CPUCores            float64 // CPUs busy
	MemUsed, MemTotal   uint64
	DiskUsed, DiskTotal uint64
	AgentRSS            uint64
}

// Totals sums the latest samples.
func (s *Sampler) Totals() Totals {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var t Totals
	for _, ser := range s.series {
		if len(ser) == 0 {
			continue
		}
		x := ser[len(ser)-1]
		if now.Sub(x.At) > 2*s.cfg.Every {
			continue
		}
		t.Sandboxes++
		t.CPUCores += x.CPUUsedPct / 100 * float64(x.CPUCount)
		t.MemUsed += x.MemUsed
		t.MemTotal += x.MemTotal
		t.DiskUsed += x.DiskUsed
		t.DiskTotal += x.DiskTotal
		t.AgentRSS += x.AgentRSS
	}
	return t
}

// Collectors export the fleet totals to /metrics.
func (s *Sampler) Collectors() []prometheus.Collector {
	gauge := func(name, help string, v func(Totals) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return v(s.Totals()) })
	}
	return []prometheus.Collector{
		gauge("space_sandboxes_sampled", "Running sandboxes with a recent usage sample.", func(t Totals) float64 { return float64(t.Sandboxes) }),
		gauge("space_sandboxes_cpu_used_cores", "CPUs busy across running sandboxes, as they account it.", func(t Totals) float64 { return t.CPUCores }),
		gauge("space_sandboxes_memory_used_bytes", "Memory used across running sandboxes (without page cache).", func(t Totals) float64 { return float64(t.MemUsed) }),
		gauge("space_sandboxes_agent_memory_bytes", "Memory SPACE's agent holds across running sandboxes (its resident set, part of memory used).", func(t Totals) float64 { return float64(t.AgentRSS) }),
		gauge("space_sandboxes_disk_used_bytes", "Root file system bytes used across running sandboxes.", func(t Totals) float64 { return float64(t.DiskUsed) }),
	}
}
