// Package cli is the `space` command line: `space serve` runs the server;
// every other verb is a client of the API (sandbox, operation) or manages
// the local data directory (token).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spacesandbox/space/client"
	"github.com/spacesandbox/space/internal/bench"
	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/server"
)

// Options are what cmd/space wires in.
type Options struct {
	// Host discovers the runtimes and templates of this host.
	Host           server.HostFunc
	Stdout, Stderr io.Writer
	Stdin          io.Reader
	// Baseline makes the bare runtime of `space bench --baseline`.
	Baseline func(ctx context.Context, runtime string, cfg BaselineConfig, spec bench.BareSpec) (bench.Bare, error)
}

// BaselineConfig is where `space bench --baseline` finds the server's
// files and the runtime's binaries on this host.
type BaselineConfig struct {
	DataDir  string // the server's data directory (its templates)
	Runsc    string // "" = from PATH
	Platform string // runsc's platform ("" = systrap, as the server)
	// The vm runtime's QEMU, guest kernel and modules, acceleration (auto,
	// kvm, tcg) and agent ("" = beside space, else PATH).
	QEMU, VMKernel, VMModules, VMAccel, AgentBin string
}

// exitError carries a process exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

// errUsage marks a usage error (exit code 2).
var errUsage = errors.New("usage")

const usage = `space — Sandboxed Platform for Agentic Code Execution

Server:
  space serve [flags]                 start SPACE (space serve -h for flags; --role control|node for a cluster)
  space token create|list|revoke      manage API tokens in the server's store
                                      (create --name N [--project P --role owner|admin|member|read-only --expires 30d --rate R --burst B --e2b])
  space project create|list|rm|quota|usage NAME   manage projects (quota --sandboxes N --running N --vcpus N --memory-mib N …)
  space template build|list|inspect|tag|rm|gc   manage templates in the data directory
                                      (list|inspect --remote: the API's templates, from any machine)

Client (SPACE_API_URL, SPACE_API_TOKEN or --api-url, --token):
  space sandbox create|list|get|metrics|pause|suspend|wake|fork|delete
  space sandbox network SANDBOX [--egress public|none --allow X --deny X --public-ingress]   (also on create)
  space operation get|wait|list
  space snapshot create SANDBOX [--name N --wait] | list [--sandbox ID] | tag SNAPSHOT NAME:TAG | untag SNAPSHOT | rm SNAPSHOT…
  space node list | cordon NODE | uncordon NODE | drain NODE   (a cluster's nodes)
  space exec SANDBOX [--cwd DIR --env K=V --timeout 30s --stdin --tty] -- COMMAND [ARG…]
  space files get SANDBOX PATH [LOCAL] | put SANDBOX LOCAL PATH | ls|stat|mkdir SANDBOX PATH | mv SANDBOX FROM TO | rm [-r] SANDBOX PATH
  space process list SANDBOX | get SANDBOX PROCESS | signal SANDBOX PROCESS [--signal SIGTERM]
  space pool get NAME:TAG | set NAME:TAG MIN_READY   (the project's warm pool of a template)
  space bench [--runtime R --template T --runs N --quick --json-out FILE --baseline --data-dir D | --density N]

Add --json to client verbs for machine-readable output.
`

// Main runs the CLI and returns the process exit code.
func Main(args []string, o Options) int {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Stdin == nil {
		o.Stdin = os.Stdin
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, args, o)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintln(o.Stderr, "space:", ee.err)
		}
		return ee.code
	}
	if errors.Is(err, errUsage) || errors.Is(err, flag.ErrHelp) {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(o.Stderr, "space:", err)
		}
		return 2
	}
	fmt.Fprintln(o.Stderr, "space:", err)
	return 1
}

func run(ctx context.Context, args []string, o Options) error {
	if len(args) < 2 {
		fmt.Fprint(o.Stderr, usage)
		return errUsage
	}
	verb, rest := args[1], args[2:]
	switch verb {
	case "serve":
		return serve(ctx, rest, o)
	case "token", "tokens":
		return tokenCmd(ctx, rest, o)
	case "project", "projects":
		return projectCmd(ctx, rest, o)
	case "sandbox", "sandboxes", "sbx":
		return sandboxCmd(ctx, rest, o)
	case "operation", "operations", "op":
		return operationCmd(ctx, rest, o)
	case "snapshot", "snapshots", "snap":
		return snapshotCmd(ctx, rest, o)
	case "node", "nodes":
		return nodeCmd(ctx, rest, o)
	case "exec":
		return execCmd(ctx, rest, o)
	case "template", "templates":
		return templateCmd(ctx, rest, o)
	case "bench":
		return benchCmd(ctx, rest, o)
	case "files", "file":
		return filesCmd(ctx, rest, o)
	case "process", "processes", "ps":
		return processCmd(ctx, rest, o)
	case "pool", "pools":
		return poolCmd(ctx, rest, o)
	case "help", "-h", "--help":
		fmt.Fprint(o.Stdout, usage)
		return nil
	}
	fmt.Fprint(o.Stderr, usage)
	return fmt.Errorf("%w: unknown command %q", errUsage, verb)
}

// clientFlags are the flags every client verb takes.
type clientFlags struct {
	apiURL string
	token  string
	json   bool
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.apiURL, "api-url", envOr("SPACE_API_URL", "http://127.0.0.1:8080"), "control-plane URL (env SPACE_API_URL)")
	config.SecretVar(fs, &c.token, "token", "SPACE_API_TOKEN", "API `token` (default: the data directory's api-token file when readable)")
	fs.BoolVar(&c.json, "json", false, "print JSON")
}

// clientFlagSet is a client verb's flag set, the client flags registered.
func clientFlagSet(name string) (*flag.FlagSet, *clientFlags) {
	cf := &clientFlags{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	cf.register(fs)
	return fs, cf
}

// parse parses a client verb's arguments (with the flags registered on fs)
// and opens its client.
func (c *clientFlags) parse(fs *flag.FlagSet, args []string, o Options) ([]string, *client.Client, error) {
	pos, err := parse(fs, args, o.Stderr)
	if err != nil {
		return nil, nil, err
	}
	cl, err := c.client()
	if err != nil {
		return nil, nil, err
	}
	return pos, cl, nil
}

// resolvedToken is the flag's or environment's token, else the data
// directory's api-token file when readable.
func (c *clientFlags) resolvedToken() string {
	if c.token != "" {
		return c.token
	}
	dir := envOr("SPACE_DATA_DIR", "/var/lib/space")
	if b, err := os.ReadFile(filepath.Join(dir, "api-token")); err == nil {
		return strings.TrimSpace(string(b))
	}
	return ""
}

func (c *clientFlags) client() (*client.Client, error) {
	tok := c.resolvedToken()
	if tok == "" {
		return nil, errors.New("no API token: set SPACE_API_TOKEN or pass --token")
	}
	return client.New(c.apiURL, tok)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// parse parses flags allowing them before and after positional arguments.
// Everything after "--" is positional, untouched. -h prints the flags to
// help.
func parse(fs *flag.FlagSet, args []string, help io.Writer) ([]string, error) {
	fs.SetOutput(io.Discard)
	var tail []string
	for i, a := range args {
		if a == "--" {
			args, tail = args[:i], args[i+1:]
			break
		}
	}
	pos, err := parseFlags(fs, args, help)
	if err != nil {
		return nil, err
	}
	return append(pos, tail...), nil
}

func parseFlags(fs *flag.FlagSet, args []string, help io.Writer) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(help)
				fs.PrintDefaults()
				return nil, flag.ErrHelp
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func serve(ctx context.Context, args []string, o Options) error {
	var cfg config.Serve
	fs := flag.NewFlagSet("space serve", flag.ContinueOnError)
	cfg.Flags(fs)
	pos, err := parse(fs, args, o.Stderr)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return fmt.Errorf("%w: serve takes no arguments", errUsage)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := newLogger(o.Stderr, cfg.LogFormat, cfg.LogLevel)
	return server.Run(ctx, &cfg, log, o.Host, nil)
}

// flagSet reports whether the command line gave flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
