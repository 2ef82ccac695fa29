//go:build linux

package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// A sandbox runs the agent binary it started with for its whole life: gVisor
// restores a save only onto the same bytes of the executable its agent was
// running (a save restored onto a replaced binary never lets its agent run
// again). So every agent binary a sandbox starts with is kept by content in
// <dir>/agents/<sha256>, the sandbox's bundle mounts that copy, and the
// sandbox directory and each of its saves record which one (agent.digest,
// beside agent.key). Replacing --agent-bin (an upgrade) then changes what new
// sandboxes run and nothing else.
//
// Sandboxes and saves made before agents were recorded (releases before
// 4373e5a) have no record: they ran whatever --agent-bin held then. That
// agent is the "legacy" one, written down once in <dir>/agents/legacy: the
// first agent this host kept (a release that keeps agents kept the one it
// found at --agent-bin on its first start, which is what the older release
// ran), which is the one at --agent-bin now when none was kept before. A data
// directory from before records must therefore be started once by a release
// whose agent is the old one — any release from 4373e5a on whose agent did
// not change — before an upgrade that changes the agent (README,
// "Upgrading").

// agentDigestFile names the file that records a sandbox's agent.
const agentDigestFile = "agent.digest"

// legacyAgentFile, in the agent store, names the agent of sandboxes and
// saves without a record.
const legacyAgentFile = "legacy"

func (r *Runtime) agentsDir() string { return filepath.Join(r.cfg.Dir, "agents") }

// agentFile is the kept agent binary of digest.
func (r *Runtime) agentFile(digest string) string { return filepath.Join(r.agentsDir(), digest) }

// keepAgent copies --agent-bin into the agent store (once per content) and
// returns its digest.
func (r *Runtime) keepAgent() (string, error) {
	in, err := os.Open(r.cfg.AgentBin)
	if err != nil {
		return "", fmt.Errorf("gvisor: agent binary: %w", err)
	}
	defer in.Close()
	h := sha256.New()
	if _, err := io.Copy(h, in); err != nil {
		return "", fmt.Errorf("gvisor: hash the agent binary: %w", err)
	}
	digest := hex.EncodeToString(h.Sum(nil))
	dst := r.agentFile(digest)
	if _, err := os.Stat(dst); err == nil {
		return digest, nil
	}
	if err := os.MkdirAll(r.agentsDir(), 0o700); err != nil {
		return "", fmt.Errorf("gvisor: %w", err)
	}
	tmp := dst + ".tmp"
	if err := copyFile(r.cfg.AgentBin, tmp); err != nil {
		return "", fmt.Errorf("gvisor: keep the agent binary: %w", err)
	}
	if err := os.Chmod(tmp, 0o555); err != nil {
		return "", fmt.Errorf("gvisor: keep the agent binary: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("gvisor: keep the agent binary: %w", err)
	}
	return digest, nil
}

// isDigest reports whether d names a kept agent: 64 lowercase hex digits.
func isDigest(d string) bool {
	return len(d) == 64 && strings.Trim(d, "0123456789abcdef") == ""
}

// legacyAgent returns the agent of sandboxes and saves without a record,
// choosing and writing it down the first time (see above). The agent at
// --agent-bin is kept before, so the store holds at least that one.
func (r *Runtime) legacyAgent() (string, error) {
	file := filepath.Join(r.agentsDir(), legacyAgentFile)
	if b, err := os.ReadFile(file); err == nil {
		if d := strings.TrimSpace(string(b)); isDigest(d) {
			return d, nil
		}
		r.log.Warn("gvisor: unreadable legacy agent record; choosing it again", "file", file)
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("gvisor: legacy agent record: %w", err)
	}
	entries, err := os.ReadDir(r.agentsDir())
	if err != nil {
		return "", fmt.Errorf("gvisor: agent store: %w", err)
	}
	legacy, oldest := r.agentDigest, time.Time{}
	for _, e := range entries {
		info, err := e.Info()
		if !isDigest(e.Name()) || err != nil || !info.Mode().IsRegular() {
			continue
		}
		if oldest.IsZero() || info.ModTime().Before(oldest) {
			legacy, oldest = e.Name(), info.ModTime()
		}
	}
	if err := replaceFile(file, []byte(legacy+"\n")); err != nil {
		return "", fmt.Errorf("gvisor: record the legacy agent: %w", err)
	}
	return legacy, nil
}

// pinLegacyAgents gives every sandbox directory without an agent record
// the legacy agent: its bundle, which mounts --agent-bin itself, mounts the
// kept copy instead, and the record says so — a wake restores onto the
// bytes it was saved with, and its later saves carry the record, whatever
// --agent-bin holds by then.
func (r *Runtime) pinLegacyAgents() error {
	root := filepath.Join(r.cfg.Dir, "sandboxes")
	entries, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("gvisor: sandboxes: %w", err)
	}
	for _, e := range entries {
		record := filepath.Join(root, e.Name(), agentDigestFile)
		if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
			continue
		}
		config := filepath.Join(r.bundleDir(e.Name()), "config.json")
		if err := repointAgentMounts(config, r.agentFile(r.legacyDigest)); err != nil {
			return fmt.Errorf("gvisor: sandbox %s: %w", e.Name(), err)
		}
		if err := os.WriteFile(record, []byte(r.legacyDigest+"\n"), 0o600); err != nil {
			return fmt.Errorf("gvisor: sandbox %s: record the agent: %w", e.Name(), err)
		}
		r.log.Info("gvisor: sandbox from a release that did not record its agent given the first agent this host kept (README, Upgrading)", "sandbox_id", e.Name(), "agent", r.legacyDigest[:12])
	}
	return nil
}

// repointAgentMounts rewrites the OCI config at path so the mounts of the
// agent (at AgentPath and SudoPath) come from agent; nothing else in it
// changes. A missing config (a sandbox directory without a bundle) is left
// so.
func repointAgentMounts(path, agent string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("bundle config: %w", err)
	}
	mounts, _ := spec["mounts"].([]any)
	for _, m := range mounts {
		if m, ok := m.(map[string]any); ok && (m["destination"] == AgentPath || m["destination"] == SudoPath) {
			m["source"] = agent
		}
	}
	if b, err = json.MarshalIndent(spec, "", " "); err != nil {
		return err
	}
	return replaceFile(path, b)
}

// agentOf is the agent a new container runs: the one the save in saveDir
// recorded when this host keeps it (a restore must run the bytes it was
// saved with), the legacy agent for a save without a record, else this
// server's.
func (r *Runtime) agentOf(saveDir string) string {
	if saveDir == "" {
		return r.agentDigest
	}
	b, err := os.ReadFile(filepath.Join(saveDir, agentDigestFile))
	if errors.Is(err, os.ErrNotExist) {
		return r.legacyDigest // a save from before agents were recorded
	}
	d := strings.TrimSpace(string(b))
	if err != nil || !isDigest(d) {
		r.log.Warn("gvisor: unreadable agent record in a save; using the current agent", "dir", saveDir, "err", err)
		return r.agentDigest
	}
	if _, err := os.Stat(r.agentFile(d)); err != nil {
		// Another host's save (a cluster's wake) made with an agent this
		// host never ran: the current one is the best there is.
		r.log.Warn("gvisor: the agent a save was made with is not on this host; restoring with the current one", "dir", saveDir, "agent", d[:12])
		return r.agentDigest
	}
	return d
}

// keepAgentRecord copies a sandbox's agent record into a save of it.
func (r *Runtime) keepAgentRecord(id, saveDir string) error {
	err := copyFile(filepath.Join(r.sandboxDir(id), agentDigestFile), filepath.Join(saveDir, agentDigestFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("keep agent record: %w", err)
	}
	return nil
}
