package metrics

import (
	"context"
	"encoding/json"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spacesandbox/space/internal/store"
)

// ProjectSource reports the projects, their quotas and what each holds.
type ProjectSource interface {
	ListProjects(ctx context.Context) ([]store.Project, error)
	ProjectUsage(ctx context.Context, name string) (store.Usage, error)
}

type projectCollector struct {
	src          ProjectSource
	usage, quota *prometheus.Desc
}

func (c projectCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.usage
	ch <- c.quota
}

// Collect reads every project's usage at scrape time (one query each).
func (c projectCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	projects, err := c.src.ListProjects(ctx)
	if err != nil {
		return
	}
	for _, p := range projects {
		u, err := c.src.ProjectUsage(ctx, p.Name)
		if err != nil {
			continue
		}
		for res, v := range fields(u) {
			ch <- prometheus.MustNewConstMetric(c.usage, prometheus.GaugeValue, float64(v), p.Name, res)
		}
		for res, v := range fields(p.Effective()) {
			if v > 0 {
				ch <- prometheus.MustNewConstMetric(c.quota, prometheus.GaugeValue, float64(v), p.Name, res)
			}
		}
	}
}

// fields names a Usage's or Quotas' numbers by their JSON names.
func fields(v any) map[string]int {
	b, _ := json.Marshal(v)
	m := map[string]int{}
	json.Unmarshal(b, &m)
	return m
}

// WatchProjects exports each project's usage and the quotas it is held to
// (series per project and resource; a quota of no bound has none).
func (m *Metrics) WatchProjects(src ProjectSource) {
	m.reg.MustRegister(projectCollector{src: src,
		usage: prometheus.NewDesc("space_project_usage", "What a project holds, per resource (sandboxes, running_sandboxes, vcpus, memory_mib, disk_mib, snapshot_mib, templates, warm_pool).", []string{"project", "resource"}, nil),
		quota: prometheus.NewDesc("space_project_quota", "The quota a project is held to, per resource (absent: no bound).", []string{"project", "resource"}, nil)})
}
