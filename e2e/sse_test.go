package e2e

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spacesandbox/space/client"
	"github.com/spacesandbox/space/internal/runtime/fakeruntime"
)

// event is one Server-Sent Event.
type event struct {
	id, name string
	data     []byte
}

// stream reads events from an attach response.
type stream struct {
	resp *http.Response
	r    *bufio.Reader
	// pings counts keepalive comments seen.
	pings int
}

func (s *stream) next() (event, error) {
	var ev event
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if ev.name != "" {
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
			s.pings++
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.data = append(ev.data, line[6:]...)
		default:
			return ev, fmt.Errorf("unexpected SSE line %q", line)
		}
	}
}

func (s *stream) close() { s.resp.Body.Close() }

// session is a created command session.
type session struct {
	SessionID string `json:"session_id"`
	ProcessID string `json:"process_id"`
	Attach    struct {
		URL       string    `json:"url"`
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	} `json:"attach"`
}

func (s *server) command(sbx string, body any) session {
	s.t.Helper()
	b, _ := json.Marshal(body)
	r := s.do("POST", "/v1/sandboxes/"+sbx+"/commands", s.token, b)
	if r.status != 201 {
		s.t.Fatalf("create command = %d %s", r.status, r.body)
	}
	var sess session
	r.json(s.t, &sess)
	return sess
}

// attach opens the event stream of a session.
func (s *server) attach(url, token, lastEventID string) (*stream, *http.Response) {
	s.t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Accept", "text/event-stream")
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatalf("attach: %v", err)
	}
	if resp.StatusCode != 200 {
		return nil, resp
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		s.t.Fatalf("attach Content-Type = %q", ct)
	}
	return &stream{resp: resp, r: bufio.NewReaderSize(resp.Body, 1<<20)}, resp
}

// transcript is everything a stream delivered until its end.
type transcript struct {
	stdout, stderr []byte
	ids            []string
	events         []string // event names in order (output collapsed)
	exitCode       *int
	signal         string
	errCode        string
	lastID         string
	complete       bool
}

// collect reads a stream to its end (or until stop returns true after an
// output event).
func collect(t *testing.T, st *stream, tr *transcript, stop func(*transcript) bool) {
	t.Helper()
	defer st.close()
	for {
		ev, err := st.next()
		if err != nil {
			if err == io.EOF || strings.Contains(err.Error(), "closed") {
				return
			}
			t.Fatalf("read stream: %v", err)
		}
		if ev.id != "" {
			tr.ids = append(tr.ids, ev.id)
			tr.lastID = ev.id
		}
		if len(tr.events) == 0 || tr.events[len(tr.events)-1] != ev.name || ev.name != "output" {
			tr.events = append(tr.events, ev.name)
		}
		switch ev.name {
		case "output":
			var o struct{ Stream, Data string }
			if err := json.Unmarshal(ev.data, &o); err != nil {
				t.Fatalf("output event %s: %v", ev.data, err)
			}
			b, err := base64.StdEncoding.DecodeString(o.Data)
			if err != nil {
				t.Fatalf("output data: %v", err)
			}
			if o.Stream == "stderr" {
				tr.stderr = append(tr.stderr, b...)
			} else {
				tr.stdout = append(tr.stdout, b...)
			}
			if stop != nil && stop(tr) {
				return
			}
		case "process_exited":
			var x struct {
				ExitCode *int   `json:"exit_code"`
				Signal   string `json:"signal"`
			}
			json.Unmarshal(ev.data, &x)
			tr.exitCode, tr.signal, tr.complete = x.ExitCode, x.Signal, true
			return
		case "error":
			var x struct{ Code string }
			json.Unmarshal(ev.data, &x)
			tr.errCode, tr.complete = x.Code, true
			return
		case "resync_required":
		default:
			t.Fatalf("unknown event %q", ev.name)
		}
	}
}

// runCommand creates a session, attaches and collects the whole transcript.
func (s *server) runCommand(sbx string, body any) (*transcript, session) {
	s.t.Helper()
	sess := s.command(sbx, body)
	st, resp := s.attach(sess.Attach.URL, sess.Attach.Token, "")
	if st == nil {
		b, _ := io.ReadAll(resp.Body)
		s.t.Fatalf("attach = %d %s", resp.StatusCode, b)
	}
	tr := &transcript{}
	collect(s.t, st, tr, nil)
	return tr, sess
}

// killAgents ends the host processes a FAKE-runtime server left behind.
func killAgents(dataDir string) {
	files, _ := filepath.Glob(filepath.Join(dataDir, "runtime", "fake", "*.json"))
	for _, f := range files {
		var st struct {
			AgentPID int `json:"agent_pid"`
		}
		b, _ := os.ReadFile(f)
		if json.Unmarshal(b, &st) == nil && st.AgentPID > 0 {
			fakeruntime.KillSession(st.AgentPID)
		}
	}
}

var _ = context.Background
var _ = client.IsCode
