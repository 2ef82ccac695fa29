// Package bench measures SPACE through its public API, row by row of the
// project's performance targets, and reports medians and p95s.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spacesandbox/space/client"
)

// Config says what to measure against.
type Config struct {
	APIURL, Token string
	Runtime       string // "" = the server's default
	Template      string // "" = the server's default
	Runs          int    // samples per latency row
	StreamBytes   int64  // bytes streamed for the throughput row
	DirtyMiB      int    // memory dirtied before each suspend
	ReadSeconds   float64
	// EgressURL, when set, adds the egress rows (egress.go): a URL the
	// sandboxes can reach that answers ?n=N with N bytes; EgressBytes is
	// the download's size. EgressOnly measures only those rows.
	EgressURL   string
	EgressBytes int64
	EgressOnly  bool
	// Baseline, when set, makes the bare runtime each row is compared
	// with (baseline.go), measured in the same run, sample by sample in
	// turn with SPACE's.
	Baseline func(ctx context.Context, runtime string, spec BareSpec) (Bare, error)
	// Density is how many idle sandboxes Density holds at once.
	Density int
	Out     io.Writer
}

// Row is one measured target.
type Row struct {
	// Key names the work the row measures (the bare row it compares with).
	Key     string    `json:"key,omitempty"`
	Name    string    `json:"name"`
	Unit    string    `json:"unit"`
	Samples int       `json:"samples"`
	P50     float64   `json:"p50"`
	P95     float64   `json:"p95"`
	P99     float64   `json:"p99,omitempty"`
	Value   float64   `json:"value,omitempty"` // for throughput rows
	Target  string    `json:"target"`
	Raw     []float64 `json:"raw,omitempty"`
	// With a baseline: the bare runtime's p50 for the same work (same
	// unit), what it measured, and SPACE's p50 over it.
	Bare     float64   `json:"bare,omitempty"`
	BareRaw  []float64 `json:"bare_raw,omitempty"`
	BareNote string    `json:"bare_note,omitempty"`
	Ratio    float64   `json:"ratio,omitempty"`
}

// Report is the whole run.
type Report struct {
	Runtime string    `json:"runtime"`
	When    time.Time `json:"when"`
	Rows    []Row     `json:"rows"`
	// Baseline: the rows carry the bare runtime's figures.
	Baseline bool `json:"baseline,omitempty"`
}

func pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(p*float64(len(s)-1) + 0.5)
	return s[i]
}

func latencyRow(key bareKey, name, target string, ds []time.Duration) Row {
	ms := make([]float64, len(ds))
	for i, d := range ds {
		ms[i] = float64(d.Microseconds()) / 1000
	}
	return Row{Key: string(key), Name: name, Unit: "ms", Samples: len(ms), P50: pct(ms, .5), P95: pct(ms, .95), Target: target, Raw: ms}
}

// rateRow is a throughput row over samples xs: its p50, and as p95 the
// rate 95 % of the samples reached (the slow tail).
func rateRow(key bareKey, name, unit, target string, xs []float64) Row {
	v := pct(xs, .5)
	return Row{Key: string(key), Name: name, Unit: unit, Samples: len(xs), Value: v, P50: v, P95: pct(xs, .05), Target: target, Raw: xs}
}

// streamRuns is how many times each streaming row runs: a third of the
// latency rows' samples (one 512 MiB stream moves ±20 % between runs).
func streamRuns(runs int) int { return max(1, runs/3) }

func (b *bench) say(format string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...) }

type bench struct {
	cfg Config
	c   *client.Client
	// With a baseline: the bare sandbox, alive beside SPACE's from the
	// create row on, and whether it can run commands (a VMM cannot).
	bare     Bare
	bareNoEx bool
}

func (b *bench) create(ctx context.Context) (string, time.Duration, error) {
	start := time.Now()
	out, _, err := b.c.CreateSandbox(ctx, client.CreateSandboxRequest{Runtime: b.cfg.Runtime, Template: b.cfg.Template}, "")
	if err != nil {
		return "", 0, err
	}
	op, err := b.c.WaitOperation(ctx, out.Operation.ID)
	if err != nil {
		return out.Sandbox.ID, 0, err
	}
	if op.State != "succeeded" {
		return out.Sandbox.ID, 0, fmt.Errorf("create failed: %+v", op.Error)
	}
	return out.Sandbox.ID, time.Since(start), nil
}

func (b *bench) step(ctx context.Context, id, action string) (time.Duration, error) {
	start := time.Now()
	op, _, err := b.c.Lifecycle(ctx, action, id, "")
	if err != nil {
		return 0, err
	}
	if op, err = b.c.WaitOperation(ctx, op.ID); err != nil {
		return 0, err
	}
	if op.State != "succeeded" {
		return 0, fmt.Errorf("%s failed: %+v", action, op.Error)
	}
	return time.Since(start), nil
}

// run executes argv and returns the time to process_exited and the bytes of
// output seen.
func (b *bench) run(ctx context.Context, id string, argv ...string) (time.Duration, int64, error) {
	return b.runWith(ctx, b.c, id, argv...)
}

// runWith is run through client c (the binary stream, or SSE).
func (b *bench) runWith(ctx context.Context, c *client.Client, id string, argv ...string) (time.Duration, int64, error) {
	start := time.Now()
	sess, err := c.CreateCommand(ctx, id, client.CommandRequest{Command: argv}, "")
	if err != nil {
		return 0, 0, err
	}
	var n int64
	term, err := c.Attach(ctx, sess, "", 0, func(ev client.Event) error { n += int64(len(ev.Data)); return nil })
	if err != nil {
		return 0, n, err
	}
	if term.Name != "process_exited" || term.ExitCode == nil || *term.ExitCode != 0 {
		return 0, n, fmt.Errorf("%v ended with %s %s", argv, term.Name, term.Message)
	}
	return time.Since(start), n, nil
}

// deleted deletes a sandbox a row made and waits until it is gone, so the
// next run is not measured beside its teardown (a VM under TCG costs CPU
// until its QEMU ends). Best effort: the bench's own cleanup retries.
func deleted(ctx context.Context, c *client.Client, id string) {
	if op, _, err := c.Lifecycle(ctx, "delete", id, ""); err == nil {
		c.WaitOperation(ctx, op.ID)
	}
}

// newBench connects to the server and starts a report of the runtime it
// measures.
func newBench(cfg Config) (*bench, *Report, error) {
	c, err := client.New(cfg.APIURL, cfg.Token)
	if err != nil {
		return nil, nil, err
	}
	rep := &Report{Runtime: cfg.Runtime, When: time.Now().UTC()}
	if rep.Runtime == "" {
		rep.Runtime = serverDefaultRuntime(cfg.APIURL)
	}
	return &bench{cfg: cfg, c: c}, rep, nil
}

// Run measures every row and writes the table to cfg.Out. With a
// baseline, each row takes SPACE's sample and the bare runtime's in turn,
// so both columns of a row come from the same minutes of the machine (a
// loaded or throttled minute weighs on both, not on one).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	b, rep, err := newBench(cfg)
	if err != nil {
		return nil, err
	}
	c := b.c
	var made []string
	defer func() {
		for _, id := range made {
			c.Lifecycle(context.WithoutCancel(ctx), "delete", id, "")
		}
	}()
	defer b.closeBare()
	say := b.say

	creates := cfg.Runs
	if cfg.EgressOnly {
		creates = 1
	}
	say("create → running, %d runs", creates)
	var ds, dels []time.Duration
	var bareXs, bareDels []float64
	// As the bare sandbox is, each sandbox but the last is deleted before
	// the next create: the rows after it run beside one sandbox, not beside
	// every sandbox the create row made (idle VMs under TCG cost CPU).
	// Those deletes are the delete row.
	for i := 0; i < creates; i++ {
		if i > 0 {
			d, err := b.step(ctx, made[len(made)-1], "delete")
			if err != nil {
				return nil, err
			}
			dels = append(dels, d)
		}
		id, d, err := b.create(ctx)
		if id != "" {
			made = append(made, id)
		}
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
		if i == 0 && cfg.Baseline != nil && !cfg.EgressOnly {
			if err := b.openBare(ctx, rep.Runtime, id); err != nil {
				return nil, err
			}
		}
		if b.bare != nil {
			if i > 0 {
				x, err := timed(ctx, "delete", b.bare.Delete)
				if err != nil {
					return nil, err
				}
				bareDels = append(bareDels, x)
			}
			x, err := timed(ctx, "create", b.bare.Create)
			if err != nil {
				return nil, err
			}
			bareXs = append(bareXs, x)
		}
	}
	id := made[len(made)-1]
	if cfg.EgressURL != "" {
		say("egress: download and %d new connections from %s", cfg.Runs, cfg.EgressURL)
		rows, err := b.egressRows(ctx, id)
		if err != nil {
			return nil, err
		}
		if cfg.EgressOnly {
			rep.Rows = rows
			printTable(cfg.Out, rep)
			return rep, nil
		}
		defer func() { rep.Rows = append(rep.Rows, rows...) }()
	}
	rep.Rows = append(rep.Rows, b.compared(latencyRow(bareCreate, "create → running (API call to operation succeeded; a warm pool serves it when one is set)", "p50 ≤ 50 ms from a pool/snapshot; cold gvisor p50 ≤ 300 ms", ds), bareXs))
	if len(dels) > 0 {
		rep.Rows = append(rep.Rows, b.compared(latencyRow(bareDelete, "delete a running sandbox → deleted", "≤ 1.1× bare", dels), bareDels))
	}

	say("exec round trip (`true`), %d runs", cfg.Runs)
	// One command first, not measured: the bare row's sandbox ran its
	// first command in its create (its create row ends at that command's
	// exit), so its exec row starts on a sandbox that has run one.
	if _, _, err := b.run(ctx, id, "true"); err != nil {
		return nil, err
	}
	ds, bareXs = nil, nil
	for i := 0; i < cfg.Runs; i++ {
		d, _, err := b.run(ctx, id, "true")
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
		if x, err := b.bareExec(ctx, io.Discard, "true"); err != nil {
			return nil, err
		} else if x > 0 {
			bareXs = append(bareXs, x)
		}
	}
	rep.Rows = append(rep.Rows, b.compared(latencyRow(bareExec, "exec round trip: session + attach + true → process_exited", "p50 ≤ 5 ms", ds), bareXs))

	sse := *c
	sse.SSE = true
	for _, s := range []struct {
		key    bareKey
		argv   []string
		what   string
		c      *client.Client
		how    string
		target string
	}{
		{bareDD, ddArgv(cfg.StreamBytes), fmt.Sprintf("dd bs=1M count=%d", cfg.StreamBytes>>20), &sse, "to an SSE client", "≥ 0.8× bare"},
		{bareHead, headArgv(cfg.StreamBytes), fmt.Sprintf("head -c %d /dev/zero", cfg.StreamBytes), &sse, "to an SSE client", "≥ 0.8× bare"},
		{bareDD, ddArgv(cfg.StreamBytes), fmt.Sprintf("dd bs=1M count=%d", cfg.StreamBytes>>20), c, "on the binary stream", "≥ 0.9× bare"},
		{bareHead, headArgv(cfg.StreamBytes), fmt.Sprintf("head -c %d /dev/zero", cfg.StreamBytes), c, "on the binary stream", "≥ 0.9× bare"},
	} {
		say("stdout streaming %s: %s, %d runs", s.how, s.what, streamRuns(cfg.Runs))
		var rates []float64
		bareXs = nil
		for range streamRuns(cfg.Runs) {
			d, n, err := b.runWith(ctx, s.c, id, s.argv...)
			if err != nil {
				return nil, err
			}
			if n != cfg.StreamBytes {
				return nil, fmt.Errorf("%s streamed %d bytes, want %d", s.what, n, cfg.StreamBytes)
			}
			rates = append(rates, float64(n)/(1<<20)/d.Seconds())
			var w countWriter
			if x, err := b.bareExec(ctx, &w, s.argv...); err != nil {
				return nil, err
			} else if x > 0 {
				if w.n.Load() != cfg.StreamBytes {
					return nil, fmt.Errorf("baseline: %v: %d bytes, want %d", s.argv, w.n.Load(), cfg.StreamBytes)
				}
				bareXs = append(bareXs, float64(cfg.StreamBytes)/(1<<20)/(x/1000))
			}
		}
		rep.Rows = append(rep.Rows, b.compared(rateRow(s.key, "stdout streaming "+s.how+" ("+s.what+")", "MiB/s", s.target, rates), bareXs))
	}

	say("pause/wake, %d runs", cfg.Runs)
	var pauses, wakes []time.Duration
	var barePauses, bareResumes []float64
	for i := 0; i < cfg.Runs; i++ {
		p, err := b.step(ctx, id, "pause")
		if err != nil {
			return nil, err
		}
		w, err := b.step(ctx, id, "wake")
		if err != nil {
			return nil, err
		}
		pauses, wakes = append(pauses, p), append(wakes, w)
		if b.bare != nil {
			p, err := timed(ctx, "pause", b.bare.Pause)
			if err != nil {
				return nil, err
			}
			r, err := timed(ctx, "resume", b.bare.Resume)
			if err != nil {
				return nil, err
			}
			barePauses, bareResumes = append(barePauses, p), append(bareResumes, r)
		}
	}
	rep.Rows = append(rep.Rows, b.compared(latencyRow(barePause, "pause → paused", "p50 ≤ 20 ms; ≤ 1.1× bare", pauses), barePauses),
		b.compared(latencyRow(bareResume, "wake (paused) → running", "p50 ≤ 20 ms; ≤ 1.1× bare", wakes), bareResumes))

	runs := max(1, cfg.Runs/2)
	say("suspend/wake with %d MiB dirty, %d runs", cfg.DirtyMiB, runs)
	var susp, rest []time.Duration
	var bareSusp, bareRest []float64
	for i := 0; i < runs; i++ {
		if _, _, err := b.run(ctx, id, dirtyArgv(cfg.DirtyMiB)...); err != nil {
			return nil, err
		}
		s, err := b.step(ctx, id, "suspend")
		if err != nil {
			return nil, err
		}
		w, err := b.step(ctx, id, "wake")
		if err != nil {
			return nil, err
		}
		susp, rest = append(susp, s), append(rest, w)
		if b.bare != nil {
			if _, err := b.bareExec(ctx, io.Discard, dirtyArgv(cfg.DirtyMiB)...); err != nil {
				return nil, err
			}
			s, err := timed(ctx, "suspend", b.bare.Suspend)
			if err != nil {
				return nil, err
			}
			w, err := timed(ctx, "wake", b.bare.Wake)
			if err != nil {
				return nil, err
			}
			bareSusp, bareRest = append(bareSusp, s), append(bareRest, w)
		}
	}
	rep.Rows = append(rep.Rows, b.compared(latencyRow(bareSuspend, fmt.Sprintf("suspend → suspended (%d MiB dirty)", cfg.DirtyMiB), "p50 ≤ 300 ms; ≤ 1.1× bare", susp), bareSusp),
		b.compared(latencyRow(bareWake, "wake (suspended) → running", "p50 ≤ 150 ms; < bare", rest), bareRest))

	say("fork ×1 with %d MiB dirty, %d runs", cfg.DirtyMiB, runs)
	var forks []time.Duration
	bareXs = nil
	for i := 0; i < runs; i++ {
		// Dirty again first, as the suspend row does: the fork is of a
		// running sandbox, not of one still paging its memory in after
		// the wake before it.
		if _, _, err := b.run(ctx, id, dirtyArgv(cfg.DirtyMiB)...); err != nil {
			return nil, err
		}
		start := time.Now()
		op, copies, _, err := c.Fork(ctx, id, 1, "")
		if client.IsCode(err, "failed_precondition") {
			say("fork: skipped, %v", err)
			break
		}
		if err != nil {
			return nil, err
		}
		for _, f := range copies {
			made = append(made, f.ID)
		}
		if op, err = c.WaitOperation(ctx, op.ID); err != nil {
			return nil, err
		}
		if op.State != "succeeded" {
			return nil, fmt.Errorf("fork failed: %+v", op.Error)
		}
		forks = append(forks, time.Since(start))
		for _, f := range copies {
			deleted(ctx, c, f.ID)
		}
		if b.bare != nil {
			if _, err := b.bareExec(ctx, io.Discard, dirtyArgv(cfg.DirtyMiB)...); err != nil {
				return nil, err
			}
			x, err := timed(ctx, "fork", b.bare.Fork)
			if err != nil {
				return nil, err
			}
			bareXs = append(bareXs, x)
		}
	}
	if len(forks) > 0 {
		rep.Rows = append(rep.Rows, b.compared(latencyRow(bareFork, fmt.Sprintf("fork ×1 → running (%d MiB dirty)", cfg.DirtyMiB), "gvisor p50 ≤ 300 ms", forks), bareXs))
		say("create from a snapshot (%d MiB dirty), %d runs", cfg.DirtyMiB, runs)
		snap, op, err := c.CreateSnapshot(ctx, id, "", "")
		if err != nil {
			return nil, err
		}
		defer c.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID)
		if op, err = c.WaitOperation(ctx, op.ID); err != nil || op.State != "succeeded" {
			return nil, fmt.Errorf("snapshot: %v %+v", err, op)
		}
		// The bare side saves once too; its starts leave the save as it
		// was (as a snapshot must stay), and its sandbox comes back from
		// it after.
		if b.bare != nil {
			if err := b.bare.Suspend(ctx); err != nil {
				return nil, fmt.Errorf("baseline: suspend: %w", err)
			}
		}
		var froms []time.Duration
		bareXs = nil
		for i := 0; i < runs; i++ {
			start := time.Now()
			out, _, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Snapshot: snap.ID}, "")
			if err != nil {
				return nil, err
			}
			made = append(made, out.Sandbox.ID)
			if op, err := c.WaitOperation(ctx, out.Operation.ID); err != nil || op.State != "succeeded" {
				return nil, fmt.Errorf("create from snapshot: %v %+v", err, op)
			}
			froms = append(froms, time.Since(start))
			deleted(ctx, c, out.Sandbox.ID)
			if b.bare != nil {
				x, err := timed(ctx, "start from a save", b.bare.FromSave)
				if err != nil {
					return nil, err
				}
				bareXs = append(bareXs, x)
			}
		}
		if b.bare != nil {
			if err := b.bare.Wake(ctx); err != nil {
				return nil, fmt.Errorf("baseline: wake: %w", err)
			}
		}
		rep.Rows = append(rep.Rows, b.compared(latencyRow(bareFrom, fmt.Sprintf("create from a snapshot → running (%d MiB dirty)", cfg.DirtyMiB), "≤ create from the template", froms), bareXs))
	}

	say("control-plane reads for %.0fs", cfg.ReadSeconds)
	rps, err := readRate(ctx, cfg, id)
	if err != nil {
		return nil, err
	}
	rep.Rows = append(rep.Rows, b.compared(rateRow("reads", "control-plane reads: GET /v1/sandboxes/{id}, 16 connections", "req/s", "≥ 10,000 req/s", []float64{rps}), nil))

	if b.bare != nil {
		if err := b.bare.Delete(ctx); err != nil {
			return nil, fmt.Errorf("baseline: delete: %w", err)
		}
		rep.Baseline = true
	}
	printTable(cfg.Out, rep)
	return rep, nil
}

func readRate(ctx context.Context, cfg Config, id string) (float64, error) {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	hc := &http.Client{Transport: tr}
	url := strings.TrimRight(cfg.APIURL, "/") + "/v1/sandboxes/" + id
	var count atomic.Int64
	var firstErr atomic.Value
	deadline := time.Now().Add(time.Duration(cfg.ReadSeconds * float64(time.Second)))
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				req.Header.Set("Authorization", "Bearer "+cfg.Token)
				resp, err := hc.Do(req)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					firstErr.CompareAndSwap(nil, fmt.Errorf("GET sandbox: %d", resp.StatusCode))
					return
				}
				count.Add(1)
			}
		}()
	}
	start := time.Now()
	wg.Wait()
	if e, ok := firstErr.Load().(error); ok {
		return 0, e
	}
	return float64(count.Load()) / time.Since(start).Seconds(), nil
}

func printTable(w io.Writer, rep *Report) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "runtime %s\n", rep.Runtime)
	if !rep.Baseline {
		fmt.Fprintln(tw, "WHAT\tN\tP50\tP95\tTARGET")
		for _, r := range rep.Rows {
			target := r.Target
			if r.P99 > 0 {
				target = fmt.Sprintf("P99 %.1f %s; %s", r.P99, r.Unit, target)
			}
			fmt.Fprintf(tw, "%s\t%d\t%.1f %s\t%.1f %s\t%s\n", r.Name, r.Samples, r.P50, r.Unit, r.P95, r.Unit, target)
		}
		tw.Flush()
		return
	}
	fmt.Fprintln(tw, "WHAT\tN\tP50\tP95\tBARE P50\tSPACE/BARE\tTARGET\tBARE MEASURED")
	for _, r := range rep.Rows {
		bare, ratio := "—", "—"
		if r.Bare > 0 {
			bare, ratio = fmt.Sprintf("%.1f %s", r.Bare, r.Unit), fmt.Sprintf("%.2f", r.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f %s\t%.1f %s\t%s\t%s\t%s\t%s\n", r.Name, r.Samples, r.P50, r.Unit, r.P95, r.Unit, bare, ratio, r.Target, r.BareNote)
	}
	tw.Flush()
}

// WriteJSON writes the report as JSON.
func WriteJSON(path string, rep *Report) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

// serverDefaultRuntime asks /readyz which runtime creates use by default.
func serverDefaultRuntime(apiURL string) string {
	resp, err := http.Get(strings.TrimRight(apiURL, "/") + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var r struct {
		Default string `json:"default_runtime"`
	}
	json.NewDecoder(resp.Body).Decode(&r)
	return r.Default
}
