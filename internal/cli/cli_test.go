package cli

import (
	"flag"
	"strings"
	"testing"
)

// Every client verb's -h lists --token: the token from the environment is
// used, never printed.
func TestClientHelpNeverShowsTheToken(t *testing.T) {
	t.Setenv("SPACE_API_TOKEN", "space_token_from_the_environment")
	var c clientFlags
	fs := flag.NewFlagSet("sandbox list", flag.ContinueOnError)
	c.register(fs)
	var help strings.Builder
	fs.SetOutput(&help)
	fs.PrintDefaults()
	if strings.Contains(help.String(), "space_token_from_the_environment") || !strings.Contains(help.String(), "-token token") {
		t.Fatalf("-h:\n%s", help.String())
	}
	if _, err := parse(fs, nil); err != nil {
		t.Fatal(err)
	}
	if got := c.resolvedToken(); got != "space_token_from_the_environment" {
		t.Fatalf("token = %q, want the environment's", got)
	}
}
