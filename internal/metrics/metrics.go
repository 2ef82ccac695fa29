// Package metrics holds SPACE's Prometheus metrics: request latency and
// outcome per route, and lifecycle operation latency and outcome per kind.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// Metrics is one registry of SPACE metrics.
type Metrics struct {
	reg         *prometheus.Registry
	reqDuration *prometheus.HistogramVec
	opDuration  *prometheus.HistogramVec
	failures    *prometheus.CounterVec
	transfers   *prometheus.HistogramVec
	transferred *prometheus.CounterVec
}

// New registers SPACE's metrics on a fresh registry.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		reqDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_http_request_duration_seconds",
			Help:    "Latency of HTTP requests by listener, route, method and status code.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"listener", "route", "method", "code"}),
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_operation_duration_seconds",
			Help:    "Latency of lifecycle operations from start of execution to outcome, by kind and outcome.",
			Buckets: []float64{.001, .005, .01, .02, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"kind", "outcome"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_sandbox_failures_total",
			Help: "Sandboxes whose processes ended on their own, by runtime and reason (out_of_memory, killed).",
		}, []string{"runtime", "reason"}),
		transfers: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "space_blobstore_transfer_duration_seconds",
			Help:    "Suspend snapshots stored in (put) and fetched from (get) the blob store, by direction and outcome.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"direction", "outcome"}),
		transferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "space_blobstore_transfer_bytes_total",
			Help: "Bytes of suspend snapshots stored in (put) and fetched from (get) the blob store.",
		}, []string{"direction"}),
	}
	m.reg.MustRegister(m.reqDuration, m.opDuration, m.failures, m.transfers, m.transferred,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// ObserveRequest records one HTTP request. Every label takes a bounded set
// of values whatever a client sends: an unknown method is "other", and so
// is a status outside 100–599 (0 stays: nothing was written); routes are
// the route table's patterns or "unmatched".
func (m *Metrics) ObserveRequest(listener, route, method string, code int, d time.Duration) {
	status := "other"
	if code == 0 || code >= 100 && code <= 599 {
		status = strconv.Itoa(code)
	}
	m.reqDuration.WithLabelValues(listener, route, boundedMethod(method), status).Observe(d.Seconds())
}

func boundedMethod(m string) string {
	switch m {
	case "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE":
		return m
	}
	return "other"
}

// OperationFinished records one lifecycle operation (lifecycle.Observer).
func (m *Metrics) OperationFinished(kind sandbox.OpKind, state sandbox.OpState, d time.Duration) {
	m.opDuration.WithLabelValues(string(kind), string(state)).Observe(d.Seconds())
}

// SandboxFailed counts a sandbox that failed on its own
// (lifecycle.FailureObserver).
func (m *Metrics) SandboxFailed(runtime, reason string) {
	m.failures.WithLabelValues(runtime, reason).Inc()
}

// SnapshotTransferred records one snapshot moved to or from the blob store
// (lifecycle.ArchiveObserver); direction is "put" or "get".
func (m *Metrics) SnapshotTransferred(direction string, bytes int64, d time.Duration, err error) {
	outcome := "succeeded"
	if err != nil {
		outcome = "failed"
	}
	m.transfers.WithLabelValues(direction, outcome).Observe(d.Seconds())
	m.transferred.WithLabelValues(direction).Add(float64(bytes))
}

// Register adds further collectors (for example gauges owned by other
// packages).
func (m *Metrics) Register(c ...prometheus.Collector) { m.reg.MustRegister(c...) }

// SandboxCounter counts sandboxes by state and pool membership.
type SandboxCounter interface {
	CountSandboxes(ctx context.Context) ([]store.SandboxCount, error)
}

// sandboxGauge reports space_sandboxes{state, pool} at scrape time.
type sandboxGauge struct {
	src  SandboxCounter
	desc *prometheus.Desc
}

func (g sandboxGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g sandboxGauge) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	counts, err := g.src.CountSandboxes(ctx)
	if err != nil {
		return
	}
	for _, c := range counts {
		pool := "false"
		if c.Pooled {
			pool = "true"
		}
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, float64(c.Count), string(c.State), pool)
	}
}

// WatchSandboxes exports the number of sandboxes per state, warm-pool
// sandboxes (pool="true") apart from users'.
func (m *Metrics) WatchSandboxes(src SandboxCounter) {
	m.reg.MustRegister(sandboxGauge{src: src, desc: prometheus.NewDesc("space_sandboxes",
		"Sandboxes by state; pool=\"true\" are warm-pool sandboxes waiting to be claimed.", []string{"state", "pool"}, nil)})
}

// StatusWriter wraps a handler's ResponseWriter to learn the status it
// wrote, for ObserveRequest. Flushing and http.ResponseController keep
// working through it.
type StatusWriter struct {
	http.ResponseWriter
	Status int
}

func (w *StatusWriter) WriteHeader(code int) {
	if w.Status == 0 {
		w.Status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *StatusWriter) Write(b []byte) (int, error) {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush flushes (Connect's streaming handlers look for http.Flusher).
func (w *StatusWriter) Flush() {
	if w.Status == 0 {
		w.Status = http.StatusOK
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// NetStat is one sandbox's network traffic and policy decisions.
type NetStat struct {
	SandboxID                 string
	BytesOut, BytesIn         int64 // from and to the sandbox
	ConnsAllowed, ConnsDenied int64
	DNSAllowed, DNSDenied     int64
}

// NetStats reports every sandbox's network counters.
type NetStats interface{ NetStats() []NetStat }

type netCollector struct {
	src                NetStats
	bytes, conns, dnsQ *prometheus.Desc
}

func (c netCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.bytes
	ch <- c.conns
	ch <- c.dnsQ
}

func (c netCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.src.NetStats() {
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(s.BytesOut), s.SandboxID, "out")
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(s.BytesIn), s.SandboxID, "in")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(s.ConnsAllowed), s.SandboxID, "allowed")
		ch <- prometheus.MustNewConstMetric(c.conns, prometheus.CounterValue, float64(s.ConnsDenied), s.SandboxID, "denied")
		ch <- prometheus.MustNewConstMetric(c.dnsQ, prometheus.CounterValue, float64(s.DNSAllowed), s.SandboxID, "allowed")
		ch <- prometheus.MustNewConstMetric(c.dnsQ, prometheus.CounterValue, float64(s.DNSDenied), s.SandboxID, "denied")
	}
}

// WatchNetwork exports per-sandbox network counters (one series per
// sandbox that has a network; a deleted sandbox's series go with it).
func (m *Metrics) WatchNetwork(src NetStats) {
	m.reg.MustRegister(netCollector{src: src,
		bytes: prometheus.NewDesc("space_sandbox_network_bytes_total", "Bytes a sandbox sent (out) and received (in).", []string{"sandbox_id", "direction"}, nil),
		conns: prometheus.NewDesc("space_sandbox_network_connections_total", "New outbound connections of a sandbox by policy verdict.", []string{"sandbox_id", "verdict"}, nil),
		dnsQ:  prometheus.NewDesc("space_sandbox_dns_queries_total", "DNS queries of a sandbox by policy verdict.", []string{"sandbox_id", "verdict"}, nil),
	})
}
