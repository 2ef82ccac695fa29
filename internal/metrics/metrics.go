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
	}
	m.reg.MustRegister(m.reqDuration, m.opDuration,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// ObserveRequest records one HTTP request.
func (m *Metrics) ObserveRequest(listener, route, method string, code int, d time.Duration) {
	m.reqDuration.WithLabelValues(listener, route, method, strconv.Itoa(code)).Observe(d.Seconds())
}

// OperationFinished records one lifecycle operation (lifecycle.Observer).
func (m *Metrics) OperationFinished(kind sandbox.OpKind, state sandbox.OpState, d time.Duration) {
	m.opDuration.WithLabelValues(string(kind), string(state)).Observe(d.Seconds())
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
