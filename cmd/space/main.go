// Command space is SPACE's single binary: the server (`space serve`) and the
// CLI. Everything but wiring lives under internal/.
package main

import (
	"os"

	"github.com/spacesandbox/space/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args, cli.Options{Host: host, Baseline: baseline}))
}
