package cli

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/spacesandbox/space/internal/bench"
	"github.com/spacesandbox/space/internal/config"
)

// benchCmd measures a running server through its public API:
// space bench [--runtime R] [--template T] [--runs N] [--quick] [--json FILE].
func benchCmd(ctx context.Context, args []string, o Options) error {
	var cf clientFlags
	fs := flag.NewFlagSet("space bench", flag.ContinueOnError)
	cf.register(fs)
	rt := fs.String("runtime", "", "runtime to measure (default: the server's)")
	tpl := fs.String("template", "", "template to create sandboxes from (default: the server's)")
	runs := fs.Int("runs", 20, "samples per latency row")
	quick := fs.Bool("quick", false, "few samples (5, unless --runs is given) and smaller transfers (CI)")
	out := fs.String("json-out", "", "also write the report as JSON to this file")
	egress := fs.String("egress-url", "", "also measure egress from a sandbox: a URL it can reach that answers ?n=N with N bytes")
	egressOnly := fs.Bool("egress-only", false, "measure only the egress rows (needs --egress-url)")
	density := fs.Int("density", 0, "instead of the rows: hold this many idle sandboxes at once and measure memory per sandbox, the server's footprint, reads and a create while they idle (run on the server's host)")
	base := fs.Bool("baseline", false, "also measure the bare runtime doing each row's work on this host, and the ratio (needs the server's --data-dir; root)")
	dataDir := fs.String("data-dir", envOr("SPACE_DATA_DIR", "/var/lib/space"), "with --baseline: the server's data directory (env SPACE_DATA_DIR)")
	runsc := fs.String("runsc", os.Getenv("SPACE_RUNSC"), "with --baseline: runsc binary (default: from PATH) (env SPACE_RUNSC)")
	// The vm runtime's own flags of `space serve`, same defaults and
	// environment: the bare VM must be the server's.
	var bc BaselineConfig
	for _, f := range []struct {
		p                *string
		name, def, usage string
	}{
		{&bc.QEMU, "qemu", config.DefaultQEMU, "QEMU binary"},
		{&bc.VMKernel, "vm-kernel", config.DefaultVMKernel, "guest kernel"},
		{&bc.VMModules, "vm-modules", config.DefaultVMModules, "the guest kernel's module tree"},
		{&bc.VMAccel, "vm-accel", "auto", "vm acceleration: auto, kvm or tcg"},
		{&bc.AgentBin, "agent-bin", "", "space-agent binary (default: beside space, else from PATH)"},
	} {
		fs.StringVar(f.p, f.name, envOr(config.EnvName(f.name), f.def), fmt.Sprintf("with --baseline on vm: %s, as the server's (env %s)", f.usage, config.EnvName(f.name)))
	}
	if _, err := parse(fs, args, o.Stderr); err != nil {
		return err
	}
	tok := cf.resolvedToken()
	if tok == "" {
		return fmt.Errorf("no API token: set SPACE_API_TOKEN or pass --token")
	}
	cfg := bench.Config{APIURL: cf.apiURL, Token: tok, Runtime: *rt, Template: *tpl, Runs: *runs,
		StreamBytes: 512 << 20, DirtyMiB: 200, ReadSeconds: 5, Out: o.Stdout,
		EgressURL: *egress, EgressBytes: 1 << 30, EgressOnly: *egressOnly}
	if *quick {
		cfg.StreamBytes, cfg.DirtyMiB, cfg.ReadSeconds, cfg.EgressBytes = 64<<20, 32, 1, 64<<20
		if !flagSet(fs, "runs") {
			cfg.Runs = 5
		}
	}
	if cfg.EgressOnly && cfg.EgressURL == "" {
		return fmt.Errorf("%w: --egress-only needs --egress-url", errUsage)
	}
	if cfg.Runs < 1 {
		return fmt.Errorf("%w: --runs must be at least 1", errUsage)
	}
	if *base {
		if o.Baseline == nil {
			return fmt.Errorf("--baseline: this binary has no bare runtimes")
		}
		bc.DataDir, bc.Runsc = *dataDir, *runsc
		cfg.Baseline = func(ctx context.Context, rt string, spec bench.BareSpec) (bench.Bare, error) {
			return o.Baseline(ctx, rt, bc, spec)
		}
	}
	run := bench.Run
	if *density > 0 {
		cfg.Density, run = *density, bench.Density
	}
	rep, err := run(ctx, cfg)
	if err != nil {
		return err
	}
	if *out != "" {
		return bench.WriteJSON(*out, rep)
	}
	return nil
}
