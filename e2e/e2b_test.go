package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// requireE2BSDK finds node and the pinned E2B SDK (scripts/install-deps
// installs both); it skips without them, and fails in CI.
func requireE2BSDK(t *testing.T) string {
	t.Helper()
	dir, _ := filepath.Abs(filepath.Join("testdata", "e2b"))
	why := ""
	if _, err := exec.LookPath("node"); err != nil {
		why = "node is not installed"
	} else if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		why = "the E2B SDK is not installed (run scripts/install-deps)"
	}
	if why != "" {
		if os.Getenv("SPACE_REQUIRE_E2B_SDK") == "1" {
			t.Fatalf("SPACE_REQUIRE_E2B_SDK=1 but %s", why)
		}
		t.Skip(why)
	}
	return dir
}

// The unmodified E2B SDK, pointed at SPACE by its two URL variables, runs a
// whole session on gVisor sandboxes from seed:latest: create, commands
// (output, exit errors, env, cwd, user, background, stdin), files (text,
// binary, multipart, octet-stream, gzip, several, list/stat/mkdir/rename/
// remove), pause (= suspend) and its state in getInfo and list filters,
// connect (= restore) with files and processes intact, setTimeout, kill,
// and both timeout actions.
func TestE2BSDK(t *testing.T) {
	if testing.Short() {
		t.Skip("builds seed:latest and runs the E2B SDK")
	}
	sdk := requireE2BSDK(t)
	requireGVisor(t)
	s := startSeedServer(t, "gvisor")
	// The SDK runs with a token in E2B's key format (space token create --e2b).
	created, _, code := s.runCLI("token", "create", "--name", "e2b-sdk", "--e2b", "--json")
	var key struct{ Token string }
	if json.Unmarshal([]byte(created), &key); code != 0 || !regexp.MustCompile(`^e2b_[0-9a-f]{40}$`).MatchString(key.Token) {
		t.Fatalf("token create --e2b: exit %d, %s", code, created)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "sdk.test.mjs")
	cmd.Dir = sdk
	cmd.Env = append(os.Environ(),
		"E2B_API_URL=http://"+s.ecwAddr, "E2B_SANDBOX_URL=http://"+s.ecwAddr, "E2B_API_KEY="+key.Token,
		"UPSTREAM_PUBLIC="+s.up.Public[0].String(), "UPSTREAM_PUBLIC2="+s.up.Public[1].String())
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("E2B SDK script (%s):\n%s", time.Since(start).Round(time.Millisecond), out)
	if err != nil || !strings.HasSuffix(strings.TrimSpace(string(out)), "ALL OK") {
		t.Fatalf("the E2B SDK script failed: %v\nserver log:\n%s", err, s.log())
	}

	// The README's E2B example, as written.
	example, _ := filepath.Abs(filepath.Join("..", "examples", "e2b_quickstart.cjs"))
	cmd = exec.CommandContext(ctx, "node", example)
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(sdk, "node_modules"),
		"E2B_API_URL=http://"+s.ecwAddr, "E2B_SANDBOX_URL=http://"+s.ecwAddr, "E2B_API_KEY="+s.token)
	out, err = cmd.CombinedOutput()
	if err != nil || string(out) != "hello from user in /home/user\nkept across pause\n" {
		t.Fatalf("examples/e2b_quickstart.cjs: %v\n%s", err, out)
	}
}
