package cli

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// -h prints every flag's default, and help text ends up in logs: the
// token, the database URL and the cluster key taken from the environment
// are used, never printed.
func TestHelpNeverShowsSecretsFromTheEnvironment(t *testing.T) {
	secrets := map[string]string{
		"SPACE_API_TOKEN":   "space_token_from_the_environment",
		"SPACE_STORE":       "postgres://space:hunter2@db:5432/space",
		"SPACE_CLUSTER_KEY": "cluster-key-from-the-environment",
	}
	for k, v := range secrets {
		t.Setenv(k, v)
	}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"space", "sandbox", "list", "-h"}, "-token token"},
		{[]string{"space", "exec", "-h"}, "-token token"},
		{[]string{"space", "token", "list", "-h"}, "-store URL"},
		{[]string{"space", "template", "gc", "-h"}, "-store URL"},
		{[]string{"space", "serve", "-h"}, "-cluster-key secret"},
	} {
		args := c.args
		help := helpOf(t, args)
		if !strings.Contains(help, c.flag) {
			t.Fatalf("%v does not describe %s:\n%s", args, c.flag, help)
		}
		for _, v := range secrets {
			if strings.Contains(help, v) {
				t.Errorf("%v shows %q:\n%s", args, v, help)
			}
		}
	}
	var c clientFlags
	fs := flag.NewFlagSet("sandbox list", flag.ContinueOnError)
	c.register(fs)
	if _, err := parse(fs, nil, io.Discard); err != nil {
		t.Fatal(err)
	}
	if got := c.resolvedToken(); got != secrets["SPACE_API_TOKEN"] {
		t.Fatalf("token = %q, want the environment's", got)
	}
}

// helpOf runs the CLI with args and returns all it wrote.
func helpOf(t *testing.T, args []string) string {
	t.Helper()
	var out, errOut strings.Builder
	Main(args, Options{Stdout: &out, Stderr: &errOut})
	return out.String() + errOut.String()
}
