package metrics

import (
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/spacesandbox/space/internal/procfs"
)

// hostGauge reports the host's capacity and use at scrape time: CPUs,
// memory (total and available, from /proc/meminfo), the 1-minute load
// average, and the most sandboxes this server keeps active at once.
type hostGauge struct {
	maxSandboxes                         int
	cpus, memTotal, memAvail, load1, max *prometheus.Desc
}

// WatchHost exports the host's capacity and use (space_host_*), and
// maxSandboxes (0: no cap) as space_sandboxes_max.
func (m *Metrics) WatchHost(maxSandboxes int) {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	m.reg.MustRegister(hostGauge{maxSandboxes: maxSandboxes,
		cpus:     d("space_host_cpus", "CPUs this server's process may use."),
		memTotal: d("space_host_memory_bytes", "The host's memory (MemTotal)."),
		memAvail: d("space_host_memory_available_bytes", "Memory the host can still give without swapping (MemAvailable)."),
		load1:    d("space_host_load1", "The host's 1-minute load average."),
		max:      d("space_sandboxes_max", "The most sandboxes this server keeps active at once (0: no cap)."),
	})
}

func (g hostGauge) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.cpus, g.memTotal, g.memAvail, g.load1, g.max} {
		ch <- d
	}
}

func (g hostGauge) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	gauge(g.cpus, float64(goruntime.NumCPU()))
	gauge(g.max, float64(g.maxSandboxes))
	if mem, err := procfs.MemInfo(); err == nil {
		gauge(g.memTotal, float64(mem["MemTotal"]))
		gauge(g.memAvail, float64(mem["MemAvailable"]))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				gauge(g.load1, v)
			}
		}
	}
}
