package usage

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spacesandbox/space/internal/lifecycle/enginetest"
	"github.com/spacesandbox/space/internal/sandbox"
)

// The sampler asks each running sandbox's (real, in-process) agent and
// keeps a series per sandbox; paused ones get none; series are bounded by
// time and filtered by range; totals and /metrics sum the latest samples.
func TestSamplerKeepsSeriesOfRunningSandboxes(t *testing.T) {
	w := enginetest.NewWorld(t)
	run, paused := w.Engine.Add(sandbox.Running), w.Engine.Add(sandbox.Paused)
	s := New(Config{Sandboxes: w.Engine, Agents: &enginetest.Agents{Engine: w.Engine, IO: w.IO}, Every: time.Hour, Keep: time.Hour})
	ctx := context.Background()
	for range 3 {
		s.SampleAll(ctx)
		time.Sleep(20 * time.Millisecond)
	}
	ser := s.Series(run.ID, time.Time{}, time.Time{})
	if len(ser) != 3 {
		t.Fatalf("running sandbox: %d samples, want 3", len(ser))
	}
	x := ser[2]
	if x.CPUCount < 1 || x.MemTotal == 0 || x.MemUsed == 0 || x.MemUsed > x.MemTotal || x.DiskTotal == 0 || x.DiskUsed > x.DiskTotal || x.CPUUsedPct < 0 || x.CPUUsedPct > 100 || x.AgentRSS == 0 {
		t.Errorf("implausible sample: %+v", x)
	}
	if !ser[0].At.Before(ser[2].At) {
		t.Errorf("not in time order: %v, %v", ser[0].At, ser[2].At)
	}
	if got := s.Series(paused.ID, time.Time{}, time.Time{}); len(got) != 0 {
		t.Errorf("paused sandbox sampled: %v", got)
	}
	if got := s.Series(run.ID, ser[1].At, time.Time{}); len(got) != 2 {
		t.Errorf("from the second sample: %d", len(got))
	}
	if got := s.Series(run.ID, time.Time{}, ser[0].At); len(got) != 1 {
		t.Errorf("up to the first sample: %d", len(got))
	}
	tot := s.Totals()
	if tot.Sandboxes != 1 || tot.MemUsed != x.MemUsed || tot.DiskUsed != x.DiskUsed || tot.AgentRSS != x.AgentRSS {
		t.Errorf("totals %+v, latest sample %+v", tot, x)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collectors()...)
	fams, err := reg.Gather()
	got := map[string]float64{}
	for _, f := range fams {
		got[f.GetName()] = f.GetMetric()[0].GetGauge().GetValue()
	}
	if err != nil || got["space_sandboxes_sampled"] != 1 || got["space_sandboxes_memory_used_bytes"] != float64(x.MemUsed) ||
		got["space_sandboxes_agent_memory_bytes"] != float64(x.AgentRSS) {
		t.Errorf("collectors: %v, %v", got, err)
	}
	// A sandbox that stops being sampled loses its series after Keep.
	s.forget(time.Now().Add(2 * time.Hour))
	if got := s.Series(run.ID, time.Time{}, time.Time{}); len(got) != 0 {
		t.Errorf("series kept past Keep: %d", len(got))
	}
}

// An agent above the warning bound is logged once, with the sandbox's id,
// and again only after it has been back under the bound.
func TestSamplerWarnsOnceOfAnAgentAboveItsBound(t *testing.T) {
	w := enginetest.NewWorld(t)
	run := w.Engine.Add(sandbox.Running)
	var logs bytes.Buffer
	cfg := Config{Sandboxes: w.Engine, Agents: &enginetest.Agents{Engine: w.Engine, IO: w.IO}, Every: time.Hour, Keep: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), AgentWarn: 1}
	s := New(cfg)
	ctx := context.Background()
	for range 3 {
		s.SampleAll(ctx)
	}
	if n := strings.Count(logs.String(), "agent holds more memory"); n != 1 || !strings.Contains(logs.String(), run.ID) {
		t.Fatalf("want one warning naming %s, got %d:\n%s", run.ID, n, logs.String())
	}
	s.cfg.AgentWarn = 1 << 62 // back under
	s.SampleAll(ctx)
	s.cfg.AgentWarn = 1
	s.SampleAll(ctx)
	if n := strings.Count(logs.String(), "agent holds more memory"); n != 2 {
		t.Fatalf("after falling under and rising again: %d warnings, want 2", n)
	}
}
