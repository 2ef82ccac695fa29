package storetest

// The cases only concurrency across processes can show: workers — the test
// binary run again — open the same database and race on one idempotency
// key, one sandbox, one warm pool and the active-sandbox limit. Nothing is
// shared between them but the database.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spacesandbox/space/internal/errdefs"
	"github.com/spacesandbox/space/internal/ids"
	"github.com/spacesandbox/space/internal/sandbox"
	"github.com/spacesandbox/space/internal/store"
)

// OpenURL opens the database a URL (or file path) names.
type OpenURL func(ctx context.Context, url string) (store.Store, error)

// The environment a worker reads its part from.
const (
	envCase = "SPACE_STORETEST_WORKER"
	envURL  = "SPACE_STORETEST_URL"
	envID   = "SPACE_STORETEST_ID"
	envAt   = "SPACE_STORETEST_AT"
	envArg  = "SPACE_STORETEST_ARG"
)

// Workers the race cases start, and rounds each runs.
const (
	raceWorkers = 4
	raceRounds  = 30
)

// WorkerMain runs this process's part of a race case when it is a worker,
// and exits; otherwise it returns at once. Call it first in TestMain.
func WorkerMain(open OpenURL) {
	c := os.Getenv(envCase)
	if c == "" {
		return
	}
	err := work(c, open)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// RunRaces runs the race cases; newURL makes a new empty database and
// returns what open takes to reach it.
func RunRaces(t *testing.T, newURL func(t *testing.T) string, open OpenURL) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, s store.Store) string // → the workers' argument
		check func(t *testing.T, s store.Store, arg string, wins []string)
	}{
		{"SameIdempotencyKey", nil, checkIdemRace},
		{"SameSandbox", setupSandboxRace, checkSandboxRace},
		{"SameWarmPool", setupPoolRace, checkPoolRace},
		{"ActiveLimit", nil, checkLimitRace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := newURL(t)
			ctx := context.Background()
			s, err := open(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var arg string
			if tc.setup != nil {
				arg = tc.setup(t, s)
			}
			wins := runWorkers(t, tc.name, url, arg)
			tc.check(t, s, arg, wins)
		})
	}
}

// runWorkers starts the workers, lets them begin at the same instant, and
// returns every line they printed.
func runWorkers(t *testing.T, name, url, arg string) []string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(time.Second).UnixNano() // after every process has opened the database
	var mu sync.Mutex
	var lines []string
	var wg sync.WaitGroup
	for w := 0; w < raceWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(exe, "-test.run=^$")
			cmd.Env = append(os.Environ(), envCase+"="+name, envURL+"="+url, envID+"="+strconv.Itoa(w),
				envAt+"="+strconv.FormatInt(at, 10), envArg+"="+arg)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := cmd.Run(); err != nil {
				t.Errorf("worker %d: %v: %s", w, err, errb.String())
				return
			}
			mu.Lock()
			defer mu.Unlock()
			sc := bufio.NewScanner(&out)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return lines
}

// work is one worker: it opens the database, waits for the agreed instant
// and races; it prints one line per thing it won.
func work(name string, open OpenURL) error {
	ctx := context.Background()
	s, err := open(ctx, os.Getenv(envURL))
	if err != nil {
		return err
	}
	defer s.Close()
	me := os.Getenv(envID)
	at, _ := strconv.ParseInt(os.Getenv(envAt), 10, 64)
	time.Sleep(time.Until(time.Unix(0, at)))
	arg := os.Getenv(envArg)
	switch name {
	case "SameIdempotencyKey":
		// Every worker sends the same requests (the same keys) at once:
		// each key is reserved by exactly one and its change made once.
		for i := 0; i < raceRounds; i++ {
			key := "key-" + strconv.Itoa(i)
			_, reserved, err := s.ReserveIdempotencyKey(ctx, store.IdempotencyRecord{Key: key, Fingerprint: "f", Owner: "boot-" + me,
				CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)})
			if err != nil {
				return fmt.Errorf("reserve %s: %w", key, err)
			}
			if !reserved {
				continue
			}
			sb, op := newSandbox(sandbox.Starting)
			sb.Metadata = map[string]string{"key": key}
			idem := &store.Completion{Key: key, Status: 202, Body: func() ([]byte, error) { return []byte(sb.ID), nil }}
			if err := s.CreateSandbox(ctx, sb, op, idem, 0); err != nil {
				return fmt.Errorf("create under %s: %w", key, err)
			}
			fmt.Println(key, sb.ID)
		}
	case "SameSandbox":
		// Every worker begins an operation on each sandbox at once: one
		// wins each, the others are refused with a conflict.
		for _, id := range strings.Split(arg, ",") {
			op := &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpPause, SandboxID: id, State: sandbox.OpPending, CreatedAt: epoch, UpdatedAt: epoch}
			_, err := s.BeginOperation(ctx, op, func(sb *sandbox.Sandbox, op *sandbox.Operation) (*store.Completion, error) {
				if sb.ActiveOperation != "" {
					return nil, errdefs.New(errdefs.Conflict, "operation %s in flight", sb.ActiveOperation)
				}
				op.From = sb.State
				sb.State, sb.ActiveOperation = sandbox.Pausing, op.ID
				return nil, nil
			})
			if errors.Is(err, errdefs.Conflict) {
				continue
			}
			if err != nil {
				return fmt.Errorf("begin on %s: %w", id, err)
			}
			fmt.Println(id, op.ID)
		}
	case "SameWarmPool":
		// Every worker claims from one pool until it is empty: no sandbox
		// is handed out twice, none is left behind.
		for {
			sb, op, err := s.ClaimPoolSandbox(ctx, "pool", func(sb *sandbox.Sandbox) (*sandbox.Operation, *store.Completion, error) {
				sb.Metadata = map[string]string{"claimed_by": me}
				return &sandbox.Operation{ID: ids.New(ids.Operation), Kind: sandbox.OpCreate, SandboxID: sb.ID, State: sandbox.OpSucceeded, CreatedAt: epoch, UpdatedAt: epoch}, nil, nil
			})
			if errors.Is(err, errdefs.NotFound) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("claim: %w", err)
			}
			fmt.Println(sb.ID, op.ID, me)
		}
	case "ActiveLimit":
		// Every worker creates sandboxes against one limit: together they
		// never pass it.
		for i := 0; i < raceRounds; i++ {
			sb, op := newSandbox(sandbox.Starting)
			err := s.CreateSandbox(ctx, sb, op, nil, raceRounds)
			if errors.Is(err, errdefs.ResourceExhausted) {
				continue
			}
			if err != nil {
				return fmt.Errorf("create: %w", err)
			}
			fmt.Println(sb.ID)
		}
	default:
		return fmt.Errorf("no race case %q", name)
	}
	return nil
}

func checkIdemRace(t *testing.T, s store.Store, _ string, wins []string) {
	ctx := context.Background()
	byKey := map[string]string{}
	for _, l := range wins {
		key, id, _ := strings.Cut(l, " ")
		if byKey[key] != "" {
			t.Errorf("%s reserved twice: %s and %s", key, byKey[key], id)
		}
		byKey[key] = id
	}
	if len(byKey) != raceRounds {
		t.Errorf("%d keys reserved, want %d", len(byKey), raceRounds)
	}
	all := listAll(t, s, store.SandboxQuery{})
	if len(all) != raceRounds {
		t.Errorf("%d sandboxes made, want one per key (%d)", len(all), raceRounds)
	}
	for key, id := range byKey {
		rec, err := s.GetIdempotencyKey(ctx, key)
		if err != nil || rec.State != store.IdemDone || string(rec.Body) != id {
			t.Errorf("record of %s = %+v %v, want done with %s", key, rec, err, id)
		}
	}
}

func setupSandboxRace(t *testing.T, s store.Store) string {
	var idList []string
	for i := 0; i < raceRounds; i++ {
		sb, op := newSandbox(sandbox.Running)
		sb.ActiveOperation, op.State = "", sandbox.OpSucceeded
		if err := s.CreateSandbox(context.Background(), sb, op, nil, 0); err != nil {
			t.Fatal(err)
		}
		idList = append(idList, sb.ID)
	}
	return strings.Join(idList, ",")
}

func checkSandboxRace(t *testing.T, s store.Store, arg string, wins []string) {
	ctx := context.Background()
	winner := map[string]string{}
	for _, l := range wins {
		id, op, _ := strings.Cut(l, " ")
		if winner[id] != "" {
			t.Errorf("two operations began on %s: %s and %s", id, winner[id], op)
		}
		winner[id] = op
	}
	for _, id := range strings.Split(arg, ",") {
		sb, err := s.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if winner[id] == "" || sb.ActiveOperation != winner[id] || sb.State != sandbox.Pausing {
			t.Errorf("%s: winner %q, recorded %s with operation %q", id, winner[id], sb.State, sb.ActiveOperation)
		}
		page, err := s.ListOperations(ctx, store.OperationQuery{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Items) != 2 { // its create and the one pause
			t.Errorf("%s has %d operations, want create + 1 pause", id, len(page.Items))
		}
	}
}

func setupPoolRace(t *testing.T, s store.Store) string {
	for i := 0; i < raceRounds; i++ {
		sb, op := newSandbox(sandbox.Running)
		sb.Pool, sb.ActiveOperation, op.State = "pool", "", sandbox.OpSucceeded
		if err := s.CreateSandbox(context.Background(), sb, op, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	return ""
}

func checkPoolRace(t *testing.T, s store.Store, _ string, wins []string) {
	ctx := context.Background()
	claimed := map[string]string{}
	for _, l := range wins {
		f := strings.Fields(l)
		if claimed[f[0]] != "" {
			t.Errorf("%s claimed by workers %s and %s", f[0], claimed[f[0]], f[2])
		}
		claimed[f[0]] = f[2]
	}
	if len(claimed) != raceRounds {
		t.Errorf("%d sandboxes claimed, want all %d", len(claimed), raceRounds)
	}
	if left, err := s.PoolSandboxes(ctx, "pool"); err != nil || len(left) != 0 {
		t.Errorf("left in the pool: %d %v", len(left), err)
	}
	for id, by := range claimed {
		sb, err := s.GetSandbox(ctx, id)
		if err != nil || sb.Metadata["claimed_by"] != by {
			t.Errorf("%s claimed by %s, recorded %+v %v", id, by, sb, err)
		}
	}
	workers := map[string]bool{}
	for _, by := range claimed {
		workers[by] = true
	}
	t.Logf("claims spread over workers %v", slices.Sorted(func(yield func(string) bool) {
		for w := range workers {
			if !yield(w) {
				return
			}
		}
	}))
}

func checkLimitRace(t *testing.T, s store.Store, _ string, wins []string) {
	if len(wins) != raceRounds {
		t.Errorf("%d sandboxes made under a limit of %d", len(wins), raceRounds)
	}
	if all := listAll(t, s, store.SandboxQuery{}); len(all) != raceRounds {
		t.Errorf("%d sandboxes recorded under a limit of %d", len(all), raceRounds)
	}
}
