// Package cluster is SPACE as several processes over one PostgreSQL
// database and one bucket: nodes run sandboxes, control replicas serve the
// API. Every process joins the shared store as a member and heartbeats; a
// control replica places new sandboxes on nodes (placement.go), hands each
// operation to the node that holds its sandbox (rpc.go) and forwards the
// requests that need a sandbox's agent to that node (proxy.go); one replica
// at a time marks silent nodes lost and fails what they held (sweep.go).
// Nothing here is consensus of its own: the store's transactions and
// PostgreSQL advisory locks decide.
package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/store"
)

// Store is what a cluster keeps in the database.
type Store interface {
	store.Members
}

// Config wires a member of a cluster.
type Config struct {
	Store Store
	// Liveness, when set, is the store on a pool of its own that
	// heartbeats and reads of the members use (default: Store), so that
	// work filling Store's pool never makes a busy member look dead.
	Liveness Store
	// Self is this process as a member: a node's stable id, role,
	// addresses and capacity, or a control replica.
	Self store.Member
	// Key authenticates the cluster's own calls (control → node); every
	// member has the same.
	Key string
	// Heartbeat is how often this member says it is alive (default 1 s);
	// LostAfter how long a member may be silent before it counts as gone
	// (default 10 s).
	Heartbeat, LostAfter time.Duration
	// Templates, on a node, lists the template digests it has cached
	// (placement prefers such nodes).
	Templates func() []string
	// OnLost, on a node, runs when the node learns the cluster took it for
	// lost while it was running (a partition, a stall): its sandboxes that
	// were failed meanwhile must not run on.
	OnLost func()
	Logger *slog.Logger
	Now    func() time.Time
	// Client makes the cluster's own HTTP calls (default: 10 s timeout).
	Client *http.Client
}

// Cluster is one member's view of the cluster: who is alive, where a
// sandbox may go, how to reach a node.
type Cluster struct {
	cfg Config
	log *slog.Logger
	now func() time.Time

	mu      sync.RWMutex
	members map[string]store.Member // by id, refreshed every heartbeat
	state   store.MemberState       // this member's state as recorded

	loadMu  sync.Mutex // guards loadMap, loadAt (placement.go)
	loadMap map[string]store.NodeLoad
	loadAt  time.Time

	// drain suspends what a draining node runs (set by RunSweeps).
	drain func(ctx context.Context, node string) (int, error)

	stop chan struct{}
	wg   sync.WaitGroup
}

// New makes a cluster member; Join records it.
func New(cfg Config) (*Cluster, error) {
	if cfg.Store == nil || cfg.Self.ID == "" || cfg.Self.BootID == "" {
		return nil, errors.New("cluster: store, member id and boot id are required")
	}
	if len(cfg.Key) < 16 {
		return nil, errdefs.New(errdefs.InvalidArgument, "the cluster key must be at least 16 characters (--cluster-key)")
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.LostAfter == 0 {
		cfg.LostAfter = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return time.Now().UTC() }
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Liveness == nil {
		cfg.Liveness = cfg.Store
	}
	return &Cluster{cfg: cfg, log: cfg.Logger, now: cfg.Now, members: map[string]store.Member{}, stop: make(chan struct{})}, nil
}

// SetAddresses says where other members and clients reach this member's
// listeners; call it before Join.
func (c *Cluster) SetAddresses(apiURL, dataPlaneURL, ecwURL string) {
	c.cfg.Self.URL, c.cfg.Self.DataPlaneURL, c.cfg.Self.ECWURL = apiURL, dataPlaneURL, ecwURL
}

// Self is this member's id.
func (c *Cluster) Self() string { return c.cfg.Self.ID }

// Join records this member as alive and starts heartbeating. On a node it
// returns whether the cluster had marked it lost meanwhile (its sandboxes
// were failed; the caller removes what is left of them).
func (c *Cluster) Join(ctx context.Context) (wasLost bool, err error) {
	prev, err := c.cfg.Store.GetMember(ctx, c.cfg.Self.ID)
	if err != nil && !errors.Is(err, errdefs.NotFound) {
		return false, fmt.Errorf("read this member's record: %w", err)
	}
	wasLost = err == nil && prev.State == store.MemberLost
	if err := c.join(ctx); err != nil {
		return false, err
	}
	if err := c.refresh(ctx); err != nil {
		return false, err
	}
	c.log.Info("joined the cluster", "member_id", c.cfg.Self.ID, "role", c.cfg.Self.Role, "name", c.cfg.Self.Name, "state", c.state)
	c.wg.Add(1)
	go c.beat()
	return wasLost, nil
}

func (c *Cluster) join(ctx context.Context) error {
	m := c.cfg.Self
	now := c.now()
	m.StartedAt, m.HeartbeatAt, m.State = now, now, ""
	if c.cfg.Templates != nil {
		m.Templates = c.cfg.Templates()
	}
	rec, err := c.cfg.Liveness.JoinMember(ctx, &m)
	if err != nil {
		return fmt.Errorf("join the cluster as %s: %w", m.ID, err)
	}
	c.mu.Lock()
	c.state = rec.State
	c.members[rec.ID] = *rec
	c.mu.Unlock()
	return nil
}

// beat heartbeats until Close; a node re-joins now and then so that what it
// caches (templates) stays known.
func (c *Cluster) beat() {
	defer c.wg.Done()
	t := time.NewTicker(c.cfg.Heartbeat)
	defer t.Stop()
	for n := 1; ; n++ {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LostAfter)
		var err error
		if c.cfg.Self.Role == store.RoleNode && n%15 == 0 {
			err = c.join(ctx)
		} else {
			var rec *store.Member
			if rec, err = c.cfg.Liveness.HeartbeatMember(ctx, c.cfg.Self.ID, c.cfg.Self.BootID, c.now()); err == nil {
				c.mu.Lock()
				c.state = rec.State
				c.mu.Unlock()
				if rec.State == store.MemberLost {
					c.log.Warn("the cluster marked this member lost; joining again", "member_id", c.cfg.Self.ID)
					if err = c.join(ctx); err == nil && c.cfg.OnLost != nil {
						c.cfg.OnLost()
					}
				}
			} else if errors.Is(err, errdefs.NotFound) {
				err = c.join(ctx) // (a control replica's record was removed)
			}
		}
		if err != nil {
			c.log.Warn("heartbeat", "err", err)
		}
		if err := c.refresh(ctx); err != nil {
			c.log.Warn("read the cluster's members", "err", err)
		}
		cancel()
	}
}

// refresh reads every member.
func (c *Cluster) refresh(ctx context.Context) error {
	ms, err := c.cfg.Liveness.ListMembers(ctx, "")
	if err != nil {
		return err
	}
	c.mu.Lock()
	clear(c.members)
	for _, m := range ms {
		c.members[m.ID] = m
	}
	c.mu.Unlock()
	return nil
}

// Close stops heartbeating; a control replica leaves the records (a
// node stays: its sandboxes name it, and it comes back).
func (c *Cluster) Close() {
	close(c.stop)
	c.wg.Wait()
	if c.cfg.Self.Role == store.RoleControl {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.cfg.Store.LeaveMember(ctx, c.cfg.Self.ID, c.cfg.Self.BootID); err != nil {
			c.log.Warn("leave the cluster", "err", err)
		}
	}
}

// member returns a member as last read.
func (c *Cluster) member(id string) (store.Member, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m, ok := c.members[id]
	return m, ok
}

// alive says whether m heartbeats.
func (c *Cluster) alive(m store.Member) bool {
	return m.State != store.MemberLost && c.now().Sub(m.HeartbeatAt) < c.cfg.LostAfter
}

// Alive says whether node heartbeats (lifecycle.Cluster).
func (c *Cluster) Alive(_ context.Context, node string) bool {
	m, ok := c.member(node)
	return ok && m.Role == store.RoleNode && c.alive(m)
}

// Usable says whether node heartbeats and takes new sandboxes.
func (c *Cluster) Usable(ctx context.Context, node string) bool {
	m, ok := c.member(node)
	return ok && m.Role == store.RoleNode && c.alive(m) && m.State == store.MemberReady
}

// OwnerAlive says whether the process with boot id owner is a live member
// (an idempotency reservation it holds may still complete).
func (c *Cluster) OwnerAlive(_ context.Context, owner string) bool {
	if owner == c.cfg.Self.BootID {
		return true
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, m := range c.members {
		if m.BootID == owner {
			return c.alive(m)
		}
	}
	return false
}

// LiveOwners lists the boot ids of every live member.
func (c *Cluster) LiveOwners() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := []string{c.cfg.Self.BootID}
	for _, m := range c.members {
		if c.alive(m) && m.BootID != c.cfg.Self.BootID {
			out = append(out, m.BootID)
		}
	}
	return out
}

// nodes lists the node members as last read.
func (c *Cluster) nodes() []store.Member {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []store.Member
	for _, m := range c.members {
		if m.Role == store.RoleNode {
			out = append(out, m)
		}
	}
	slices.SortFunc(out, func(a, b store.Member) int { return cmpString(a.ID, b.ID) })
	return out
}

// Runtimes lists the runtimes live nodes offer (lifecycle.Cluster).
func (c *Cluster) Runtimes() []string {
	var out []string
	for _, n := range c.nodes() {
		if !c.alive(n) {
			continue
		}
		for _, r := range n.Capacity.Runtimes {
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Portable says a live node can restore suspended sandboxes of runtime rt
// from the blob store alone (lifecycle.Cluster).
func (c *Cluster) Portable(rt string) bool {
	for _, n := range c.nodes() {
		if c.alive(n) && slices.Contains(n.Capacity.Portable, rt) {
			return true
		}
	}
	return false
}

// Ready says why no node takes sandboxes (nil: one does).
func (c *Cluster) Ready() error {
	for _, n := range c.nodes() {
		if c.alive(n) && n.State == store.MemberReady {
			return nil
		}
	}
	return errors.New("no node of the cluster is ready to take sandboxes")
}

// Authorized says whether r carries the cluster key (constant time).
func (c *Cluster) Authorized(r *http.Request) bool {
	got := r.Header.Get(KeyHeader)
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(c.cfg.Key))
	return got != "" && hmac.Equal(a[:], b[:])
}

// KeyHeader carries the cluster key on the cluster's own calls.
const KeyHeader = "X-Space-Cluster-Key"

// SigningKey derives the key every member signs attachment, sandbox
// access and ingress tokens with, so a token one member issued is
// accepted by all.
func SigningKey(clusterKey string) []byte {
	m := hmac.New(sha256.New, []byte(clusterKey))
	m.Write([]byte("space attach-token signing key v1"))
	return m.Sum(nil)
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
