//go:build linux

package gvisor

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// A sandbox runs the agent binary it started with for its whole life: gVisor
// restores a save only onto the same bytes of the executable its agent was
// running (a save restored onto a replaced binary never lets its agent run
// again). So every agent binary a sandbox starts with is kept by content in
// <dir>/agents/<sha256>, the sandbox's bundle mounts that copy, and the
// sandbox directory and each of its saves record which one (agent.digest,
// beside agent.key). Replacing --agent-bin (an upgrade) then changes what new
// sandboxes run and nothing else. Sandboxes from before this record mount
// --agent-bin itself, as they always did.

// agentDigestFile names the file that records a sandbox's agent.
const agentDigestFile = "agent.digest"

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

// agentOf is the agent a new container runs: the one the save in saveDir
// recorded when this host keeps it (a restore must run the bytes it was
// saved with), else this server's.
func (r *Runtime) agentOf(saveDir string) string {
	if saveDir == "" {
		return r.agentDigest
	}
	b, err := os.ReadFile(filepath.Join(saveDir, agentDigestFile))
	if errors.Is(err, os.ErrNotExist) {
		return r.agentDigest // a save from before agents were kept
	}
	d := strings.TrimSpace(string(b))
	if err != nil || len(d) != 64 || strings.Trim(d, "0123456789abcdef") != "" {
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
