package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
)

// The cluster's own calls, control → node, on the node's API listener
// under /internal/, authenticated by the cluster key. Each is idempotent: a
// node runs an operation once however often it is asked, and finds its
// pending operations by itself too (lifecycle's inbox), so a call that is
// lost only delays the operation by the inbox interval.
const (
	runPath     = "/internal/v1/operations/" // {id}:run
	claimedPath = "/internal/v1/sandboxes/"  // {id}:claimed
	internalDir = "/internal/"
)

// Dispatch asks node to run operation opID now (lifecycle.Cluster).
func (c *Cluster) Dispatch(node, opID string) {
	c.call(node, runPath+opID+":run")
}

// Claimed tells node a create claimed its pool sandbox (lifecycle.Cluster).
func (c *Cluster) Claimed(node, sandboxID string) {
	c.call(node, claimedPath+sandboxID+":claimed")
}

// call POSTs to a node's internal path in the background, a few times.
func (c *Cluster) call(node, path string) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		var err error
		for attempt := range 3 {
			if attempt > 0 {
				select {
				case <-c.stop:
					return
				case <-time.After(time.Duration(attempt) * 200 * time.Millisecond):
				}
			}
			if err = c.post(node, path); err == nil {
				return
			}
		}
		c.log.Warn("call a node; its inbox will find the work", "node", node, "path", path, "err", err)
	}()
}

func (c *Cluster) post(node, path string) error {
	m, ok := c.member(node)
	if !ok || m.URL == "" {
		return fmt.Errorf("node %s is not known or has no address", node)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(m.URL, "/")+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set(KeyHeader, c.cfg.Key)
	resp, err := c.cfg.Client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("node %s answered %s", node, resp.Status)
	}
	return nil
}

// NodeEngine is what a node's internal endpoints drive (lifecycle.Engine).
type NodeEngine interface {
	Run(ctx context.Context, opID string) error
	Claimed(ctx context.Context, sandboxID string) error
}

// NodeHandler serves the cluster's calls under /internal/ and hands every
// other request to next (the node's API).
func (c *Cluster) NodeHandler(e NodeEngine, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, internalDir) {
			next.ServeHTTP(w, r)
			return
		}
		if !c.Authorized(r) {
			writeErr(w, errdefs.New(errdefs.Unauthenticated, "the cluster's own endpoints need the cluster key"))
			return
		}
		if r.Method != http.MethodPost {
			writeErr(w, errdefs.New(errdefs.MethodNotAllowed, "use POST"))
			return
		}
		var err error
		switch p := r.URL.Path; {
		case strings.HasPrefix(p, runPath) && strings.HasSuffix(p, ":run"):
			id := strings.TrimSuffix(strings.TrimPrefix(p, runPath), ":run")
			if !ids.Valid(ids.Operation, id) {
				err = errdefs.New(errdefs.InvalidArgument, "malformed operation id")
			} else {
				err = e.Run(r.Context(), id)
			}
		case strings.HasPrefix(p, claimedPath) && strings.HasSuffix(p, ":claimed"):
			id := strings.TrimSuffix(strings.TrimPrefix(p, claimedPath), ":claimed")
			if !ids.Valid(ids.Sandbox, id) {
				err = errdefs.New(errdefs.InvalidArgument, "malformed sandbox id")
			} else {
				err = e.Claimed(r.Context(), id)
			}
		default:
			err = errdefs.New(errdefs.NotFound, "no such cluster endpoint")
		}
		if err != nil {
			writeErr(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
}

func writeErr(w http.ResponseWriter, err error) {
	kind := errdefs.Internal
	var k *errdefs.Error
	if errors.As(err, &k) {
		kind = k.Kind
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(kind.Status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": kind.Code, "message": err.Error()}})
}
