package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/spacesandbox/space/internal/commands"
	"github.com/spacesandbox/space/internal/lifecycle/enginetest"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// A key behaves the same whether the store holds its reservation (a
// cluster) or the memory of a lone server (Keys, shared by its planes):
// concurrent requests with one key run once and are all answered alike,
// the key used for another request on the other plane is refused, and what
// is kept is the one done record.
func TestIdempotencyKeysInStoreOrInMemory(t *testing.T) {
	for _, alone := range []bool{false, true} {
		name := "reserved in the store"
		if alone {
			name = "reserved in memory"
		}
		t.Run(name, func(t *testing.T) {
			w := enginetest.NewWorld(t)
			log := slog.New(slog.DiscardHandler)
			var keys *Keys
			if alone {
				keys = NewKeys(w.Store, "test")
			}
			ctl := New(Config{Engine: w.Engine, Commands: w.Commands, Store: w.Store, Tokens: w.Tokens, Logger: log, BootID: "test", Keys: keys})
			data := NewDataPlane(DataPlaneConfig{Commands: w.Commands, Store: w.Store, Logger: log, BootID: "test", Tokens: w.Tokens, Keys: keys})
			run := w.Engine.Add(sandbox.Running)
			send := func(h http.Handler, token, path, body, key string) *httptest.ResponseRecorder {
				req := httptest.NewRequest("POST", path, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(HeaderIdempotencyKey, key)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				return rec
			}

			const n = 6
			replies := make([]*httptest.ResponseRecorder, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					replies[i] = send(ctl, w.Key, "/v1/sandboxes/"+run.ID+"/commands", `{"command":["true"]}`, "exec-1")
				})
			}
			wg.Wait()
			replayed := 0
			for _, r := range replies {
				if r.Code != http.StatusCreated || r.Body.String() != replies[0].Body.String() {
					t.Fatalf("replies differ: %d %s / %d %s", r.Code, r.Body, replies[0].Code, replies[0].Body)
				}
				if r.Header().Get(HeaderReplayed) == "true" {
					replayed++
				}
			}
			if replayed != n-1 {
				t.Fatalf("%d of %d replies replayed, want %d: the command ran more than once", replayed, n, n-1)
			}
			// (Each session created has its own id: equal bodies mean one.)
			var sess commands.Session
			if err := json.Unmarshal(replies[0].Body.Bytes(), &sess); err != nil || sess.SessionID == "" {
				t.Fatalf("session = %s %v", replies[0].Body, err)
			}

			// The same key, another request, on the data plane.
			r := send(data, sess.Attach.Token, "/v1/sessions/"+sess.SessionID+":resize", `{"cols":80,"rows":24}`, "exec-1")
			if r.Code != http.StatusUnprocessableEntity || errorCode(r) != "idempotency_key_reused" {
				t.Fatalf("key reused on the data plane: %d %s", r.Code, r.Body)
			}

			rec, err := w.Store.GetIdempotencyKey(context.Background(), "exec-1")
			if err != nil || rec.State != store.IdemDone || rec.Status != http.StatusCreated || string(rec.Body) != replies[0].Body.String() {
				t.Fatalf("record = %+v %v", rec, err)
			}

			// An answer of the moment (409) is not kept: the key is free.
			w.Engine.Add(sandbox.Running)
			if _, err := w.Engine.Pause(context.Background(), run.ID, nil); err != nil {
				t.Fatal(err)
			}
			r = send(ctl, w.Key, "/v1/sandboxes/"+run.ID+":pause", "", "pause-1")
			if r.Code != http.StatusConflict {
				t.Fatalf("pause of a paused sandbox: %d %s", r.Code, r.Body)
			}
			if rec, err := w.Store.GetIdempotencyKey(context.Background(), "pause-1"); err == nil {
				t.Fatalf("a refusal of the moment was kept: %+v", rec)
			}
		})
	}
}
