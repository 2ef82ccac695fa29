package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/spacesandbox/space/internal/cluster"
	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/templates"
)

// NodeIDFile keeps a node's id in its data directory: a node that restarts
// is the same node, and its sandboxes are still its own.
const NodeIDFile = "node.id"

// nodeID reads this data directory's node id, making one on first start.
func nodeID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, NodeIDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if !ids.Valid(ids.Node, id) {
			return "", fmt.Errorf("%s holds no node id; remove it to make a new one", path)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read node id: %w", err)
	}
	id := ids.New(ids.Node)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write node id: %w", err)
	}
	return id, nil
}

// newMember describes this process to the cluster (addresses come once the
// listeners are bound).
func newMember(cfg *config.Serve, bootID string, rts []runtime.Runtime) (store.Member, error) {
	m := store.Member{ID: bootID, Role: store.RoleControl, BootID: bootID, Name: cfg.NodeName}
	if m.Name == "" {
		m.Name, _ = os.Hostname()
	}
	if cfg.Role != config.RoleNode {
		return m, nil
	}
	id, err := nodeID(cfg.DataDir)
	if err != nil {
		return m, err
	}
	labels, err := cfg.Labels()
	if err != nil {
		return m, err
	}
	m.ID, m.Role, m.Labels = id, store.RoleNode, labels
	m.Capacity = store.Capacity{VCPUs: goruntime.NumCPU(), MemoryMiB: int(float64(memTotalMiB()) * cfg.MemoryOvercommit), DiskMiB: diskMiB(cfg.DataDir), MaxSandboxes: cfg.MaxSandboxes}
	for _, rt := range rts {
		m.Capacity.Runtimes = append(m.Capacity.Runtimes, rt.Name())
		if rt.Capabilities().Portable {
			m.Capacity.Portable = append(m.Capacity.Portable, rt.Name())
		}
		if rt.Name() == "vm" {
			m.Capacity.Acceleration = rt.Capabilities().Detail
		}
	}
	return m, nil
}

// listenerURL is where other members reach a listener: the flag when
// given, else its bound address (a host name when it binds every
// interface).
func listenerURL(flagURL string, addr net.Addr, tls bool) string {
	if flagURL != "" {
		return flagURL
	}
	host, port, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host, _ = os.Hostname()
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}

// joinCluster records this process in the cluster once it listens.
func joinCluster(ctx context.Context, c *cluster.Cluster, log *slog.Logger) error {
	wasLost, err := c.Join(ctx)
	if err != nil {
		return err
	}
	if wasLost {
		log.Warn("this node had been marked lost; its sandboxes that were running were failed (node_lost) and are not re-adopted")
	}
	return nil
}

// cachedTemplates lists the template digests a node holds.
func cachedTemplates(ts *templates.Store) func() []string {
	return func() []string {
		if ts == nil {
			return nil
		}
		list, err := ts.List(context.Background())
		if err != nil {
			return nil
		}
		var out []string
		for _, t := range list {
			out = append(out, t.Digest)
		}
		return out
	}
}

func memTotalMiB() int {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")))
			return kb / 1024
		}
	}
	return 0
}

func diskMiB(dir string) int {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return int(st.Blocks * uint64(st.Bsize) >> 20)
}
