//go:build linux

package gvisor

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// The legacy agent — what sandboxes and saves without an agent record ran —
// is the first agent the host kept, chosen once and then fixed: a data
// directory from a release that kept agents but wrote no legacy record gets
// the agent that release kept, not the one an upgrade installs; a restart
// after a later upgrade keeps the choice. No runsc needed: this is the agent
// store's bookkeeping alone.
func TestLegacyAgentIsTheFirstKept(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(t.TempDir(), "space-agent")
	open := func(agent string) *Runtime {
		t.Helper()
		if err := os.WriteFile(bin, []byte(agent), 0o755); err != nil {
			t.Fatal(err)
		}
		r := &Runtime{cfg: Config{Dir: dir, AgentBin: bin}, log: slog.New(slog.DiscardHandler)}
		var err error
		if r.agentDigest, err = r.keepAgent(); err != nil {
			t.Fatal(err)
		}
		if r.legacyDigest, err = r.legacyAgent(); err != nil {
			t.Fatal(err)
		}
		if err := r.pinLegacyAgents(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	// A release that kept agents (without a legacy record) ran "v1" for a
	// while: its kept copy is old.
	v1 := open("agent v1")
	if err := os.Remove(filepath.Join(dir, "agents", legacyAgentFile)); err != nil {
		t.Fatal(err)
	}
	then := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(v1.agentFile(v1.agentDigest), then, then); err != nil {
		t.Fatal(err)
	}
	// A sandbox of the release before records: its bundle mounts
	// --agent-bin itself, and it has no record.
	old := filepath.Join(dir, "sandboxes", "sbx_old")
	config := filepath.Join(old, "bundle", "config.json")
	if err := os.MkdirAll(filepath.Dir(config), 0o700); err != nil {
		t.Fatal(err)
	}
	mount := func(dst, src string) map[string]any {
		return map[string]any{"destination": dst, "source": src, "type": "bind"}
	}
	before := map[string]any{"ociVersion": "1.0.0", "mounts": []any{mount("/proc", "proc"), mount(AgentPath, bin), mount(SudoPath, bin), mount(RunDir, "/run/x")}}
	b, _ := json.Marshal(before)
	if err := os.WriteFile(config, b, 0o600); err != nil {
		t.Fatal(err)
	}
	// The upgrade installs "v2".
	v2 := open("agent v2")
	if v2.agentDigest == v1.agentDigest {
		t.Fatal("two agents with one digest")
	}
	if v2.legacyDigest != v1.agentDigest {
		t.Fatalf("legacy agent after the upgrade = %.12s, want the first kept %.12s", v2.legacyDigest, v1.agentDigest)
	}
	// A save without a record gets the legacy agent; one with a record its
	// own; a new sandbox (no save) the current one.
	unrecorded, recorded := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(recorded, agentDigestFile), []byte(v2.agentDigest+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ save, want string }{{unrecorded, v1.agentDigest}, {recorded, v2.agentDigest}, {"", v2.agentDigest}} {
		if got := v2.agentOf(c.save); got != c.want {
			t.Errorf("agentOf(%q) = %.12s, want %.12s", c.save, got, c.want)
		}
	}
	// The old sandbox now mounts the kept legacy agent and records it;
	// nothing else in its bundle changed.
	var after map[string]any
	if b, err := os.ReadFile(config); err != nil || json.Unmarshal(b, &after) != nil {
		t.Fatalf("bundle after the upgrade: %v", err)
	}
	want := map[string]any{"ociVersion": "1.0.0", "mounts": []any{mount("/proc", "proc"), mount(AgentPath, v1.agentFile(v1.agentDigest)), mount(SudoPath, v1.agentFile(v1.agentDigest)), mount(RunDir, "/run/x")}}
	if !reflect.DeepEqual(after, want) {
		t.Errorf("bundle after the upgrade = %v\nwant %v", after, want)
	}
	if b, _ := os.ReadFile(filepath.Join(old, agentDigestFile)); string(b) != v1.agentDigest+"\n" {
		t.Errorf("old sandbox's agent record = %q, want %s", b, v1.agentDigest)
	}
	// Fixed once chosen: a later upgrade, even with the store's times
	// changed (a restore from backup), keeps it.
	now := time.Now()
	os.Chtimes(v1.agentFile(v1.agentDigest), now, now)
	if v3 := open("agent v3"); v3.legacyDigest != v1.agentDigest {
		t.Fatalf("legacy agent after a second upgrade = %.12s, want %.12s", v3.legacyDigest, v1.agentDigest)
	}

	// A data directory that never kept an agent: its sandboxes ran the one
	// at --agent-bin now.
	dir = t.TempDir()
	if fresh := open("agent v4"); fresh.legacyDigest != fresh.agentDigest {
		t.Fatalf("legacy agent of a new store = %.12s, want the current %.12s", fresh.legacyDigest, fresh.agentDigest)
	}
}
