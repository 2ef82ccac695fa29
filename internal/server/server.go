// Package server assembles and runs `space serve`: it opens the store under
// the data directory, makes the first API token, starts the lifecycle engine
// over the runtimes available on this host, serves the control plane and the
// data plane, and shuts all of it down gracefully.
package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spacesandbox/space/internal/api"
	"github.com/spacesandbox/space/internal/audit"
	"github.com/spacesandbox/space/internal/auth"
	"github.com/spacesandbox/space/internal/blobstore"
	"github.com/spacesandbox/space/internal/cluster"
	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/config"
	"github.com/spacesandbox/space/internal/console"
	"github.com/spacesandbox/space/internal/ecw"
	"github.com/spacesandbox/space/internal/httpguard"
	"github.com/spacesandbox/space/internal/ingress"
	"github.com/spacesandbox/space/internal/lifecycle"
	"github.com/spacesandbox/space/internal/metrics"
	"github.com/spacesandbox/space/internal/runtime"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
	"github.com/spacesandbox/space/internal/store/sqlstore"
	"github.com/spacesandbox/space/internal/templates"
	"github.com/spacesandbox/space/internal/usage"
)

// Host is what this host offers the engine: the runtimes that work here and
// the template store. It is decided by the caller (cmd/space), which knows
// which implementations this binary contains.
type Host struct {
	Runtimes  []runtime.Runtime
	Templates lifecycle.Templates
	// Default is the runtime used when a create names none ("" = first).
	Default string
	// TemplateStore, when set, is where builtin templates are built.
	TemplateStore *templates.Store
}

// HostFunc discovers what the host offers, given the configuration and the
// data directory's layout.
type HostFunc func(ctx context.Context, cfg *config.Serve, log *slog.Logger) (Host, error)

// Paths under the data directory.
const (
	DBFile       = "space.db"
	SnapshotsDir = "snapshots"
	RuntimeDir   = "runtime"
	// AttachKeyFile holds the key attachment tokens are signed with.
	AttachKeyFile = "attach.key"
)

// Run serves until ctx is cancelled, then shuts down gracefully. ready, when
// non-nil, receives the bound addresses once both listeners accept.
func Run(ctx context.Context, cfg *config.Serve, log *slog.Logger, host HostFunc, ready func(apiAddr, dataAddr net.Addr)) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := MakeDataDir(cfg.DataDir); err != nil {
		return err
	}
	lock, err := LockDataDir(ctx, cfg.DataDir)
	if err != nil {
		return err
	}
	defer lock.Release()
	for _, d := range []string{SnapshotsDir, RuntimeDir} {
		if err := os.MkdirAll(filepath.Join(cfg.DataDir, d), 0o700); err != nil {
			return fmt.Errorf("make %s directory: %w", d, err)
		}
	}
	bootID := newBootID()
	log = log.With("boot_id", bootID)

	st, err := OpenStore(ctx, cfg.Store, cfg.DataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	// A shared database serves one server at a time: each recovers the
	// sandboxes it records as its own.
	var lockLost <-chan error // (nil: never)
	if x, ok := st.(interface {
		Exclusive(context.Context) (<-chan error, error)
	}); ok && !cfg.Clustered() {
		if lockLost, err = x.Exclusive(ctx); err != nil {
			return err
		}
	}

	var bs *blobstore.S3          // snapshots and templates off the node
	var archive lifecycle.Archive // (nil unless bs is set)
	if cfg.BlobStore != "" {
		if bs, err = blobstore.Open(ctx, cfg.BlobStore); err != nil {
			return err
		}
		archive = bs
		log.Info("suspend snapshots are kept in the blob store", "blob_store", bs.String())
	}

	tokens := auth.New(st, st)
	if v := os.Getenv(auth.AdminTokenEnv); v != "" {
		if made, err := tokens.EnsureToken(ctx, "admin ("+auth.AdminTokenEnv+")", strings.TrimSpace(v)); err != nil {
			return fmt.Errorf("register the admin token of %s: %w", auth.AdminTokenEnv, err)
		} else if made {
			log.Info("registered the admin API token given in the environment", "env", auth.AdminTokenEnv)
		}
	}
	if path, err := tokens.Bootstrap(ctx, cfg.DataDir); err != nil {
		return fmt.Errorf("create first API token: %w", err)
	} else if path != "" {
		log.Info("created the first admin API token; read it from the file (it is not logged)", "path", path)
	}
	if !cfg.Clustered() {
		// (In a cluster, a sweep drops those of members that are gone.)
		if n, err := st.PruneIdempotencyKeys(ctx, time.Now().UTC(), bootID); err != nil {
			return err
		} else if n > 0 {
			log.Info("dropped expired or abandoned idempotency records", "count", n)
		}
	}

	h, err := host(ctx, cfg, log)
	if err != nil {
		return fmt.Errorf("discover runtimes: %w", err)
	}
	if cfg.Role == config.RoleControl {
		h.Runtimes = nil // a control replica runs no sandbox; its nodes do
	}
	if bs != nil && h.TemplateStore != nil {
		h.TemplateStore.SetRemote(&templates.Remote{Mirror: bs, CacheBytes: int64(cfg.TemplateCacheMiB) << 20, InUse: st.TemplatesInUse, Log: log})
	}
	var clu *cluster.Cluster
	var running atomic.Pointer[lifecycle.Engine] // (for the cluster's OnLost, once the engine runs)
	var nodeOf *string                           // the node whose sandboxes this process runs (nil: all)
	if cfg.Clustered() {
		self, err := newMember(cfg, bootID, h.Runtimes)
		if err != nil {
			return err
		}
		ccfg := cluster.Config{Store: st, Self: self, Key: cfg.ClusterKey, Heartbeat: cfg.Heartbeat, LostAfter: cfg.NodeLostAfter,
			Templates: cachedTemplates(h.TemplateStore), Logger: log}
		if l, ok := st.(interface {
			Liveness(context.Context) (*sqlstore.Store, error)
		}); ok {
			if ccfg.Liveness, err = l.Liveness(ctx); err != nil {
				return err
			}
		}
		ccfg.OnLost = func() {
			if e := running.Load(); e != nil {
				e.ReleaseLost()
			}
		}
		clu, err = cluster.New(ccfg)
		if err != nil {
			return err
		}
		if self.Role == store.RoleNode {
			nodeOf = &self.ID
			log = log.With("node", self.ID)
		}
	}
	netMgr, err := startNetwork(ctx, cfg, h, log)
	if err != nil {
		return err
	}
	if netMgr != nil {
		defer netMgr.Close()
	}
	m := metrics.New()
	m.WatchSandboxes(st)
	m.WatchHost(cfg.MaxSandboxes)
	m.WatchProjects(st)
	if netMgr != nil {
		m.WatchNetwork(netMgr)
	}
	pools, err := cfg.WarmPoolSizes()
	if err != nil {
		return err
	}
	var netIface lifecycle.Network
	if netMgr != nil {
		netIface = netMgr
	}
	eng, err := lifecycle.New(lifecycle.Config{
		Network: netIface, DefaultEgress: cfg.DefaultEgress,
		DefaultWarmPools: pools,
		Store:            st, Runtimes: h.Runtimes, DefaultRuntime: h.Default, Templates: h.Templates,
		SnapshotRoot: filepath.Join(cfg.DataDir, SnapshotsDir), Archive: archive, Logger: log, Observer: m,
		OperationTimeout: cfg.OperationTimeout, MaxActiveSandboxes: cfg.MaxSandboxes,
		DefaultAutoLifecycle: sandbox.AutoLifecycle{IdleTimeout: sandbox.FormatDuration(cfg.IdleTimeout), IdleAction: cfg.IdleAction},
		SuspendPausedAfter:   cfg.SuspendPausedAfter,
		Node:                 derefOr(nodeOf, ""),
		MaxParallelOps:       parallelOps(cfg),
		Cluster:              clusterOf(clu),
	})
	if err != nil {
		return err
	}
	defer eng.Close()
	running.Store(eng)
	if err := eng.Start(ctx); err != nil {
		return fmt.Errorf("start lifecycle engine: %w", err)
	}
	var buildWG sync.WaitGroup
	defer buildWG.Wait()
	if h.TemplateStore != nil && bs != nil {
		// Templates go to the blob store as they are built; those built
		// before (or by the offline CLI) go now.
		buildWG.Add(1)
		go func() {
			defer buildWG.Done()
			start := time.Now()
			if err := h.TemplateStore.Push(ctx); err != nil {
				log.Warn("store the node's templates in the blob store", "err", err)
				return
			}
			log.Info("the node's templates are in the blob store", "ms", time.Since(start).Milliseconds())
		}()
	}
	if h.TemplateStore != nil && cfg.BuildSeed && len(h.Runtimes) > 0 {
		// (With a blob store, a seed:latest built before is fetched.)
		if _, err := h.TemplateStore.Resolve(ctx, "seed:latest"); err != nil {
			buildWG.Add(1)
			go func() {
				defer buildWG.Done()
				buildSeed(ctx, h.TemplateStore, log)
			}()
		}
	}
	if err := eng.Ready(); err != nil {
		log.Warn("not ready to serve sandboxes", "reason", err.Error())
	} else {
		names, def := eng.Runtimes()
		log.Info("ready to serve sandboxes", "runtimes", names, "default_runtime", def)
	}

	apiLn, err := net.Listen("tcp", cfg.APIAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.APIAddr, err)
	}
	dataLn, err := net.Listen("tcp", cfg.DataPlaneAddr)
	if err != nil {
		apiLn.Close()
		return fmt.Errorf("listen on %s: %w", cfg.DataPlaneAddr, err)
	}
	var signer *auth.Signer
	if clu != nil {
		// Every member accepts the tokens any member issued.
		signer = auth.NewSigner(cluster.SigningKey(cfg.ClusterKey))
	} else if signer, err = auth.LoadSigner(filepath.Join(cfg.DataDir, AttachKeyFile)); err != nil {
		apiLn.Close()
		dataLn.Close()
		return err
	}
	dataURL := cfg.DataPlaneURL
	if dataURL == "" {
		scheme := "http"
		if cfg.TLS() {
			scheme = "https"
		}
		dataURL = scheme + "://" + dataLn.Addr().String()
	}
	cmds := commands.New(commands.Config{Agents: eng, Signer: signer, DataPlaneURL: dataURL, TokenTTL: cfg.AttachTokenTTL, Logger: log})
	sampler := usage.New(usage.Config{Sandboxes: eng, Agents: eng, Logger: log, Every: cfg.MetricsInterval, Node: nodeOf})
	m.Register(sampler.Collectors()...)
	if cfg.MetricsInterval > 0 && cfg.Role != config.RoleControl {
		var samplerWG sync.WaitGroup
		samplerCtx, stopSampler := context.WithCancel(ctx)
		samplerWG.Add(1)
		go func() { defer samplerWG.Done(); sampler.Run(samplerCtx) }()
		defer samplerWG.Wait()
		defer stopSampler()
	}
	// Every authenticated change is audited; the rate of each token is
	// bounded across the listeners of this process.
	auditLog := audit.New(st, log)
	defer auditLog.Close(context.Background())
	limiter := auth.NewLimiter()
	acfg := api.Config{Engine: eng, Commands: cmds, Store: st, Tokens: tokens, Metrics: m, Logger: log, BootID: bootID, DataDir: cfg.DataDir, Usage: sampler,
		Projects: st, Audit: auditLog, Limiter: limiter}
	if clu != nil {
		fwd := clu.APIForwarder()
		if cfg.ProxyDataPlane {
			fwd.DataPlaneURL = dataURL
		}
		acfg.Forwarder, acfg.OwnerAlive, acfg.Nodes, acfg.AttachBase = fwd, clu.OwnerAlive, clu, clu.AttachBase
	}
	if h.TemplateStore != nil {
		acfg.Templates, acfg.Builder = h.TemplateStore, h.TemplateStore
	}
	if !cfg.Clustered() {
		acfg.Keys = api.NewKeys(st, bootID)
	}
	apiSrv := api.New(acfg)
	dcfg := api.DataPlaneConfig{Commands: cmds, Store: st, Metrics: m, Logger: log, BootID: bootID, Tokens: tokens, Keys: acfg.Keys}
	if clu != nil {
		dcfg.Forwarder, dcfg.Sandbox = clu.DataPlaneForwarder(), eng.Get
	}
	var ing *ingress.Proxy
	if netMgr != nil {
		dom := cfg.SandboxDomain
		if dom == "" {
			_, port, _ := net.SplitHostPort(dataLn.Addr().String())
			dom = "localhost:" + port
		}
		ing = ingress.New(ingress.Config{Sandbox: eng.Get, Dial: netMgr.Dial, Signer: signer, Domain: dom}, log)
		dcfg.Ingress = ing
	}
	dataSrv := api.NewDataPlane(dcfg)
	var apiHandler http.Handler = apiSrv
	if clu != nil && nodeOf != nil {
		apiHandler = clu.NodeHandler(eng, apiSrv) // the cluster's calls, under /internal/
	}
	if cfg.Console && cfg.Role != config.RoleNode {
		apiHandler = console.Handler(apiHandler, dataSrv)
	}
	servers := []*http.Server{
		newHTTPServer(apiHandler, cfg, log),
		newHTTPServer(dataSrv, cfg, log),
	}
	lns := []net.Listener{httpguard.Listener(apiLn, cfg.MaxConnections), httpguard.Listener(dataLn, cfg.MaxConnections)}
	ecwAddr := ""
	if cfg.ECWAddr != "" {
		ln, err := net.Listen("tcp", cfg.ECWAddr)
		if err != nil {
			apiLn.Close()
			dataLn.Close()
			return fmt.Errorf("listen on %s (--ecw-addr; empty turns the E2B layer off): %w", cfg.ECWAddr, err)
		}
		ecwAddr = ln.Addr().String()
		ecfg := ecw.Config{Engine: eng, Commands: cmds, Tokens: tokens, Metrics: m, Logger: log, Ingress: ing, Domain: cfg.SandboxDomain, Usage: sampler,
			Audit: auditLog, Limiter: limiter}
		if clu != nil {
			ecfg.Forwarder = clu.ECWForwarder()
		}
		if ecfg.Domain == "" {
			_, port, _ := net.SplitHostPort(ecwAddr)
			ecfg.Domain = "localhost:" + port
		}
		servers = append(servers, newHTTPServer(ecw.New(ecfg), cfg, log))
		lns = append(lns, httpguard.Listener(ln, cfg.MaxConnections))
	}
	if clu != nil {
		ecwURL := ""
		if ecwAddr != "" {
			ecwURL = listenerURL(cfg.ECWURL, addrOf(ecwAddr), cfg.TLS())
		}
		clu.SetAddresses(listenerURL(cfg.NodeURL, apiLn.Addr(), cfg.TLS()), dataURL, ecwURL)
		if err := joinCluster(ctx, clu, log); err != nil {
			for _, ln := range lns {
				ln.Close()
			}
			return err
		}
		defer clu.Close()
		if cfg.Role == config.RoleControl {
			if locker, ok := st.(cluster.Locker); ok {
				clu.RunSweeps(cluster.Sweeper{Lock: locker, FailNode: eng.FailLostNode, DrainNode: eng.DrainNode, Idempotency: st, FailOrphanBuilds: eng.FailOrphanBuilds})
			}
		}
	}
	errc := make(chan error, len(servers))
	var wg sync.WaitGroup
	for i, srv := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if cfg.TLS() {
				err = srv.ServeTLS(lns[i], cfg.TLSCert, cfg.TLSKey)
			} else {
				err = srv.Serve(lns[i])
			}
			if !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	log.Info("serving", "role", cfg.Role, "api_addr", apiLn.Addr().String(), "data_plane_addr", dataLn.Addr().String(), "ecw_addr", ecwAddr, "tls", cfg.TLS(), "data_dir", cfg.DataDir, "store", storeKind(cfg.Store))
	if ready != nil {
		ready(apiLn.Addr(), dataLn.Addr())
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "grace", cfg.ShutdownGrace)
	case runErr = <-errc:
		log.Error("listener failed; shutting down", "err", runErr)
	case runErr = <-lockLost:
		log.Error("another server took this one's database; shutting down", "err", runErr)
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	for _, srv := range servers {
		srv.Shutdown(sctx)
	}
	wg.Wait()
	// Let operations in flight finish within the grace period; whatever is
	// still running is resumed by the next start.
	if d := time.Until(deadlineOf(sctx)); d > 0 {
		eng.Drain(d)
	}
	eng.Close()
	log.Info("stopped")
	return runErr
}

// parallelOps is how many operations a cluster node runs at once (a
// single machine runs every one it is given at once, as before).
func parallelOps(cfg *config.Serve) int {
	if cfg.Role != config.RoleNode {
		return 0
	}
	return max(8, 4*goruntime.NumCPU())
}

func derefOr(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}

// clusterOf is c as the engine's Cluster (a nil interface without one).
func clusterOf(c *cluster.Cluster) lifecycle.Cluster {
	if c == nil {
		return nil
	}
	return c
}

// addrOf is a bound address string as a net.Addr ("" stays empty).
func addrOf(s string) net.Addr {
	if s == "" {
		return &net.TCPAddr{}
	}
	a, _ := net.ResolveTCPAddr("tcp", s)
	return a
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// newHTTPServer serves h with deadlines against slow clients: headers
// within --header-timeout, a body that never stops for --body-idle-timeout,
// idle keep-alive connections closed after two minutes (the connection cap
// is the listener's: httpguard.Listener).
func newHTTPServer(h http.Handler, cfg *config.Serve, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           httpguard.BodyIdle(h, cfg.BodyIdle),
		ConnContext:       httpguard.ConnContext,
		ReadHeaderTimeout: cfg.HeaderTimeout,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		// Streams must not wait on Nagle's algorithm.
		ConnState: func(c net.Conn, s http.ConnState) {
			if tc, ok := c.(*net.TCPConn); ok && s == http.StateNew {
				tc.SetNoDelay(true)
			}
		},
	}
}

func newBootID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// buildSeed builds seed:latest, reporting progress in the log. The server
// is not ready until a template exists.
func buildSeed(ctx context.Context, store *templates.Store, log *slog.Logger) {
	log.Info("building the seed:latest template from Debian packages (first start; about a minute)")
	start := time.Now()
	w := &lineLogger{log: log}
	t, err := store.Build(ctx, "seed", w)
	w.flush()
	if err != nil {
		log.Error("building seed:latest failed; build it with `space template build seed`", "err", err)
		return
	}
	log.Info("seed:latest is ready", "digest", t.Digest, "duration", time.Since(start).Round(time.Millisecond))
}

// lineLogger turns a builder's output into progress log lines.
type lineLogger struct {
	log *slog.Logger
	buf []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		if line := strings.TrimSpace(string(l.buf[:i])); line != "" {
			l.log.Info("template build", "progress", line)
		}
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineLogger) flush() { l.Write([]byte("\n")) }
