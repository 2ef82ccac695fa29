package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/client"
)

// Egress rows: from inside a sandbox (curl, as in seed:latest), a TCP
// download from EgressURL (a server that answers with the bytes asked for,
// like the test upstream's /bytes?n=N) and the time to set up new TCP
// connections to it. Compare them with the same transfer between two plain
// network namespaces on the same host (e2e: TestNetworkBench).

// EgressCommands are the shell commands the egress rows run; a baseline
// outside SPACE runs the same ones. The download prints bytes/s; the
// connect loop prints one connect time (seconds) per line.
func EgressCommands(url string, bytes int64, conns int) (download, connect string) {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	download = fmt.Sprintf("curl -sS -o /dev/null -w '%%{speed_download}' '%s%sn=%d'", url, sep, bytes)
	connect = fmt.Sprintf("for i in $(seq %d); do curl -sS -o /dev/null -w '%%{time_connect}\\n' '%s%sn=1'; done", conns, url, sep)
	return download, connect
}

// ParseEgress turns the commands' output into Gbit/s and connect times.
func ParseEgress(download, connect string) (gbits float64, connects []time.Duration, err error) {
	bps, err := strconv.ParseFloat(strings.TrimSpace(download), 64)
	if err != nil {
		return 0, nil, fmt.Errorf("download output %q: %w", download, err)
	}
	for _, l := range strings.Fields(connect) {
		s, err := strconv.ParseFloat(l, 64)
		if err != nil {
			return 0, nil, fmt.Errorf("connect output %q: %w", l, err)
		}
		connects = append(connects, time.Duration(s*float64(time.Second)))
	}
	return bps * 8 / 1e9, connects, nil
}

// output runs a shell command in a sandbox and returns its stdout.
func (b *bench) output(ctx context.Context, id, script string) (string, error) {
	sess, err := b.c.CreateCommand(ctx, id, client.CommandRequest{Command: []string{"sh", "-c", script}}, "")
	if err != nil {
		return "", err
	}
	var out strings.Builder
	term, err := b.c.Attach(ctx, sess, "", 0, func(ev client.Event) error {
		if ev.Stream == "stdout" {
			out.Write(ev.Data)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if term.Name != "process_exited" || term.ExitCode == nil || *term.ExitCode != 0 {
		return out.String(), fmt.Errorf("%q ended with %s %s", script, term.Name, term.Message)
	}
	return out.String(), nil
}

func (b *bench) egressRows(ctx context.Context, id string) ([]Row, error) {
	dl, cn := EgressCommands(b.cfg.EgressURL, b.cfg.EgressBytes, b.cfg.Runs)
	dout, err := b.output(ctx, id, dl)
	if err != nil {
		return nil, err
	}
	cout, err := b.output(ctx, id, cn)
	if err != nil {
		return nil, err
	}
	gbits, conns, err := ParseEgress(dout, cout)
	if err != nil {
		return nil, err
	}
	return []Row{
		{Name: fmt.Sprintf("egress TCP download into the sandbox (curl, %d MiB)", b.cfg.EgressBytes>>20), Unit: "Gbit/s", Samples: 1, Value: gbits, P50: gbits, P95: gbits, Target: "gvisor ≥ 1 Gbit/s"},
		latencyRow("", "egress new TCP connection (curl time_connect)", "≤ 1 ms over two plain namespaces", conns),
	}, nil
}
