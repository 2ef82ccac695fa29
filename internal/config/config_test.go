package config

import (
	"flag"
	"strings"
	"testing"
)

func parse(t *testing.T, args ...string) *Serve {
	t.Helper()
	var s Serve
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	s.Flags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &s
}

func TestDefaultsAreValid(t *testing.T) {
	s := parse(t)
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.DataDir != "/var/lib/space" || s.APIAddr != "127.0.0.1:8080" || s.DataPlaneAddr != "127.0.0.1:8090" {
		t.Fatalf("defaults = %+v", s)
	}
}

func TestEnvironmentSetsDefaults(t *testing.T) {
	t.Setenv("SPACE_DATA_DIR", "/tmp/x")
	t.Setenv("SPACE_API_ADDR", "127.0.0.1:1")
	t.Setenv("SPACE_SHUTDOWN_GRACE", "3s")
	s := parse(t)
	if s.DataDir != "/tmp/x" || s.APIAddr != "127.0.0.1:1" || s.ShutdownGrace.String() != "3s" {
		t.Fatalf("env not applied: %+v", s)
	}
	if s = parse(t, "--data-dir", "/tmp/y"); s.DataDir != "/tmp/y" {
		t.Fatal("flag does not override env")
	}
}

func TestPlainHTTPOnlyOnLoopback(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--api-addr", "0.0.0.0:8080"}, "not a loopback"},
		{[]string{"--api-addr", ":8080"}, "not a loopback"},
		{[]string{"--data-plane-addr", "example.com:1"}, "not a loopback"},
		{[]string{"--api-addr", "[::1]:8080"}, ""},
		{[]string{"--api-addr", "localhost:8080"}, ""},
		{[]string{"--api-addr", "0.0.0.0:8080", "--tls-cert", "c", "--tls-key", "k"}, ""},
		{[]string{"--tls-cert", "c"}, "together"},
		{[]string{"--api-addr", "nonsense"}, "missing port"},
		{[]string{"--log-format", "xml"}, "log-format"},
		{[]string{"--data-dir", ""}, "data-dir"},
	} {
		err := parse(t, c.args...).Validate()
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%v: err = %v, want %q", c.args, err, c.err)
		}
	}
}

func TestWarmPoolSizes(t *testing.T) {
	s := Serve{WarmPools: "seed:latest=2, test=1"}
	got, err := s.WarmPoolSizes()
	if err != nil || got["seed:latest"] != 2 || got["test:latest"] != 1 || len(got) != 2 {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"seed", "seed=x", "seed=-1", "seed=101", "=2"} {
		if _, err := (&Serve{WarmPools: bad}).WarmPoolSizes(); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
}

// A flag's default is printed by -h, and usage text ends up in logs: the
// secrets taken from the environment are used but never shown.
func TestHelpNeverShowsSecretsFromTheEnvironment(t *testing.T) {
	t.Setenv("SPACE_CLUSTER_KEY", "cluster-key-from-env-0123")
	t.Setenv("SPACE_STORE", "postgres://space:hunter2@db:5432/space")
	var s Serve
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	s.Flags(fs)
	var help strings.Builder
	fs.SetOutput(&help)
	fs.PrintDefaults()
	for _, secret := range []string{"cluster-key-from-env-0123", "hunter2"} {
		if strings.Contains(help.String(), secret) {
			t.Errorf("-h shows %q:\n%s", secret, help.String())
		}
	}
	if !strings.Contains(help.String(), "-cluster-key secret") || !strings.Contains(help.String(), "SPACE_STORE") {
		t.Errorf("-h does not describe the secret flags:\n%s", help.String())
	}
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if s.ClusterKey != "cluster-key-from-env-0123" || s.Store != "postgres://space:hunter2@db:5432/space" {
		t.Fatalf("environment not applied: key %q store %q", s.ClusterKey, s.Store)
	}
	if s := parse(t, "--cluster-key", "from-the-command-line"); s.ClusterKey != "from-the-command-line" {
		t.Fatalf("flag does not override env: %q", s.ClusterKey)
	}
}
