package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// qmp is a QEMU Machine Protocol client: one command at a time over the
// VM's QMP unix socket; asynchronous events are dropped.
type qmp struct {
	conn net.Conn
	r    *bufio.Reader
	mu   sync.Mutex // one command at a time
}

// dialQMP connects and negotiates capabilities.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	q := &qmp{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	var greeting struct {
		QMP json.RawMessage `json:"QMP"`
	}
	if err := q.readJSON(&greeting); err != nil || greeting.QMP == nil {
		conn.Close()
		return nil, fmt.Errorf("qmp greeting: %v", err)
	}
	conn.SetDeadline(time.Time{})
	if _, err := q.execute(ctx, "qmp_capabilities", nil); err != nil {
		conn.Close()
		return nil, err
	}
	return q, nil
}

func (q *qmp) readJSON(v any) error {
	line, err := q.r.ReadBytes('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, v)
}

// qmpError is an error QEMU answered a command with.
type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return e.Class + ": " + e.Desc }

// execute runs a command and returns its "return" value.
func (q *qmp) execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		q.conn.SetDeadline(dl)
		defer q.conn.SetDeadline(time.Time{})
	}
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, _ := json.Marshal(req)
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	for {
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *qmpError       `json:"error"`
			Event  string          `json:"event"`
		}
		if err := q.readJSON(&resp); err != nil {
			return nil, fmt.Errorf("qmp %s: %w", cmd, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, fmt.Errorf("qmp %s: %w", cmd, resp.Error)
		default:
			return resp.Return, nil
		}
	}
}

// status is the VM's run state ("running", "paused", "inmigrate", …).
func (q *qmp) status(ctx context.Context) (string, error) {
	raw, err := q.execute(ctx, "query-status", nil)
	if err != nil {
		return "", err
	}
	var st struct {
		Status string `json:"status"`
	}
	err = json.Unmarshal(raw, &st)
	return st.Status, err
}

// waitMigration polls until the outgoing or incoming migration completes.
func (q *qmp) waitMigration(ctx context.Context) error {
	for {
		raw, err := q.execute(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var m struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		json.Unmarshal(raw, &m)
		switch m.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", m.Status, m.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (q *qmp) close() error { return q.conn.Close() }

// qmpStep is one command of a sequence.
type qmpStep struct {
	cmd  string
	args any
}

// run executes commands in order, stopping at the first error.
func (q *qmp) run(ctx context.Context, steps ...qmpStep) error {
	for _, st := range steps {
		if _, err := q.execute(ctx, st.cmd, st.args); err != nil {
			return err
		}
	}
	return nil
}

// ignoreShared makes a migration leave out RAM that lives in a shared file
// (the sandbox's RAM file): only device state moves.
var ignoreShared = qmpStep{"migrate-set-capabilities", map[string]any{
	"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}}

var errNoQMP = errors.New("no QMP socket")
