package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spacesandbox/space/internal/b64"
)

// CommandRequest starts a command session.
type CommandRequest struct {
	Command []string          `json:"command"`
	Cwd     string            `json:"cwd,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Timeout string            `json:"timeout,omitempty"`
	Stdin   bool              `json:"stdin,omitempty"`
	PTY     *PTY              `json:"pty,omitempty"`
}

// PTY asks for a terminal.
type PTY struct {
	Cols int `json:"cols"`
	Rows int `json:"rows"`
}

// Session is a created command session.
type Session struct {
	SessionID string `json:"session_id"`
	ProcessID string `json:"process_id"`
	Attach    struct {
		URL       string    `json:"url"`
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	} `json:"attach"`
}

// CreateCommand creates a command session; the process starts on Attach.
func (c *Client) CreateCommand(ctx context.Context, sandboxID string, req CommandRequest, key string) (*Session, error) {
	var out Session
	if _, err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/commands", nil, key, req, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Event is one event of a session's stream.
type Event struct {
	ID   string
	Name string // output, resync_required, process_exited, error
	// Stream and Data are set on output events (Data decoded).
	// Data is the event's only until the callback it was handed to
	// returns (its buffer is reused for the next event): copy what you keep.
	Stream string
	Data   []byte
	// ExitCode and Signal are set on process_exited (and error, when known).
	ExitCode *int
	Signal   string
	// Code and Message are set on error events.
	Code, Message string
}

// ErrIncomplete reports a stream that ended without a terminal event.
var ErrIncomplete = errors.New("event stream ended without process_exited or error")

// Attach streams a session's events to fn, starting after lastEventID ("" =
// from the start), and reconnects with Last-Event-ID when the connection
// drops, up to retries times in a row. It returns the terminal event. An
// output event's Data is fn's only while fn runs.
func (c *Client) Attach(ctx context.Context, s *Session, lastEventID string, retries int, fn func(Event) error) (*Event, error) {
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	failures := 0
	for {
		term, last, err := c.attachOnce(ctx, hc, s, lastEventID, fn)
		if term != nil {
			return term, nil
		}
		if last != "" && last != lastEventID {
			lastEventID, failures = last, 0
		}
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.Status != http.StatusServiceUnavailable && apiErr.Status != http.StatusConflict {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		failures++
		if failures > retries {
			if err == nil {
				err = ErrIncomplete
			}
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(failures) * 200 * time.Millisecond):
		}
	}
}

func (c *Client) attachOnce(ctx context.Context, hc *http.Client, s *Session, lastEventID string, fn func(Event) error) (*Event, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Attach.URL, nil)
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Authorization", "Bearer "+s.Attach.Token)
	// The binary stream where the server offers it (raw output bytes, no
	// base64), else Server-Sent Events.
	req.Header.Set("Accept", "application/octet-stream, text/event-stream;q=0.9")
	if c.SSE {
		req.Header.Set("Accept", "text/event-stream")
	}
	if lastEventID != "" {
		req.Header.Set("Last-Event-ID", lastEventID)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, "", apiError(resp.StatusCode, b)
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/octet-stream" {
		return readFrames(bufio.NewReaderSize(resp.Body, 1<<20), lastEventID, fn)
	}
	// Room for a whole output line as the server writes it (a chunk of up
	// to 1 MiB is 1.4 MiB of base64): a line is then used where it lies in
	// the buffer, not gathered first.
	r := bufio.NewReaderSize(resp.Body, 3<<19)
	last := lastEventID
	var ev Event
	var data, long, decoded []byte // reused: an event's Data is fn's only until it returns
	ready := false                 // ev was decoded from its only data line
	for {
		// ReadSlice avoids a copy per line; a line longer than the buffer
		// is gathered in long.
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			long = append(long[:0], line...)
			for err == bufio.ErrBufferFull {
				line, err = r.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err != nil {
			return nil, last, err
		}
		line = line[:len(line)-1]
		switch {
		case len(line) > 0 && line[0] == ':':
		case bytes.HasPrefix(line, []byte("id: ")):
			ev.ID = string(line[4:])
		case bytes.HasPrefix(line, []byte("event: ")):
			ev.Name = string(line[7:])
		case bytes.HasPrefix(line, []byte("data: ")):
			if len(data) == 0 && ev.Name == "output" && onlyDataLine(r) {
				// Decoded where it lies in the read buffer, without first
				// copying its 1.4 MB: Peek of a byte already buffered
				// moves nothing.
				if err := decodeEvent(&ev, line[6:], &decoded); err != nil {
					return nil, last, err
				}
				ready = true
				continue
			}
			if len(data) > 0 {
				data = append(data, '\n') // SSE joins an event's data lines with line feeds
			}
			data = append(data, line[6:]...)
		case len(line) == 0 && ev.Name != "":
			if !ready {
				if err := decodeEvent(&ev, data, &decoded); err != nil {
					return nil, last, err
				}
			}
			if term, err := deliver(ev, &last, fn); term != nil || err != nil {
				return term, last, err
			}
			ev, data, ready = Event{}, data[:0], false
		}
	}
}

// onlyDataLine reports whether the line just read is followed by the blank
// line that ends its event, looking only at bytes r already holds (a read
// would move the buffer under the line).
func onlyDataLine(r *bufio.Reader) bool {
	if r.Buffered() == 0 {
		return false
	}
	next, err := r.Peek(1)
	return err == nil && next[0] == '\n'
}

// The binary stream's frames (api.md, "Binary stream"): a 13-byte header —
// kind, event id, payload length — then the payload.
const (
	frameHeader  = 13
	maxFrameData = 64 << 20
)

var frameNames = [...]string{1: "output", 2: "output", 3: "resync_required", 4: "process_exited", 5: "error", 6: ""}

// readFrames reads the binary stream to fn until its terminal event; it
// returns the last event id seen.
func readFrames(r io.Reader, last string, fn func(Event) error) (*Event, string, error) {
	var hdr [frameHeader]byte
	var buf []byte // reused: an event's Data is fn's only until it returns
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, last, err
		}
		kind, id, n := hdr[0], binary.BigEndian.Uint64(hdr[1:9]), binary.BigEndian.Uint32(hdr[9:13])
		if kind == 0 || int(kind) >= len(frameNames) {
			return nil, last, fmt.Errorf("malformed event stream: frame kind %d", kind)
		}
		if n > maxFrameData {
			return nil, last, fmt.Errorf("malformed event stream: a %d-byte frame", n)
		}
		if cap(buf) < int(n) {
			buf = make([]byte, n)
		}
		data := buf[:n]
		if _, err := io.ReadFull(r, data); err != nil {
			return nil, last, err
		}
		ev := Event{Name: frameNames[kind]}
		if ev.Name == "" {
			continue // keepalive
		}
		if id != 0 {
			ev.ID = strconv.FormatUint(id, 10)
		}
		switch kind {
		case 1:
			ev.Stream, ev.Data = "stdout", data
		case 2:
			ev.Stream, ev.Data = "stderr", data
		default:
			if err := decodeEvent(&ev, data, nil); err != nil {
				return nil, last, err
			}
		}
		if term, err := deliver(ev, &last, fn); term != nil || err != nil {
			return term, last, err
		}
	}
}

// deliver hands a decoded event to fn, moving last to its id; it returns
// the event when it is terminal (process_exited or error).
func deliver(ev Event, last *string, fn func(Event) error) (*Event, error) {
	if ev.ID != "" {
		*last = ev.ID
	}
	if err := fn(ev); err != nil {
		return nil, err
	}
	if ev.Name == "process_exited" || ev.Name == "error" {
		return &ev, nil
	}
	return nil, nil
}

// Output events as the server writes them; decodeEvent reads these without
// a JSON parse (any other spelling takes the general path).
var (
	outputHead = []byte(`{"stream":"`)
	outputMid  = []byte(`","data":"`)
	outputTail = []byte(`"}`)
)

// decodeEvent decodes an SSE event's data into ev. Output is decoded into
// *scratch (grown as needed) when scratch is not nil.
func decodeEvent(ev *Event, data []byte, scratch *[]byte) error {
	if ev.Name == "output" && len(data) >= len(outputHead)+len(outputTail) && bytes.HasPrefix(data, outputHead) && bytes.HasSuffix(data, outputTail) {
		rest := data[len(outputHead) : len(data)-len(outputTail)]
		if i := bytes.Index(rest, outputMid); i > 0 {
			stream, enc := string(rest[:i]), rest[i+len(outputMid):]
			// Plain base64, as the server writes it, decodes here; any other
			// spelling (a JSON escape such as \/) fails and takes the general
			// path below, as do the line breaks base64's decoder would skip
			// (a JSON string cannot hold them raw).
			if (stream == "stdout" || stream == "stderr") && bytes.IndexByte(enc, '\r') < 0 && bytes.IndexByte(enc, '\n') < 0 {
				size := b64.DecodedLen(len(enc))
				var out []byte
				if scratch != nil && cap(*scratch) >= size {
					out = (*scratch)[:size]
				} else {
					out = make([]byte, size)
					if scratch != nil {
						*scratch = out
					}
				}
				if n, err := b64.Decode(out, enc); err == nil {
					ev.Stream, ev.Data = stream, out[:n]
					return nil
				}
			}
		}
	}
	var raw struct {
		Stream   string `json:"stream"`
		Data     string `json:"data"`
		ExitCode *int   `json:"exit_code"`
		Signal   string `json:"signal"`
		Code     string `json:"code"`
		Message  string `json:"message"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("malformed %s event: %w", ev.Name, err)
	}
	ev.Stream, ev.ExitCode, ev.Signal, ev.Code, ev.Message = raw.Stream, raw.ExitCode, raw.Signal, raw.Code, raw.Message
	if ev.Name == "output" {
		b, err := base64.StdEncoding.DecodeString(raw.Data)
		if err != nil {
			return fmt.Errorf("malformed output data: %w", err)
		}
		ev.Data = b
	}
	return nil
}

// Entry is a file system entry in a sandbox.
type Entry struct {
	Path    string    `json:"path"`
	Name    string    `json:"name"`
	Type    string    `json:"type"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"mtime"`
	Target  string    `json:"symlink_target,omitempty"`
	UID     int       `json:"uid"`
	GID     int       `json:"gid"`
	Owner   string    `json:"owner,omitempty"` // user name of UID in the sandbox
	Group   string    `json:"group,omitempty"` // group name of GID in the sandbox
	// Metadata is the file's user-defined metadata (E2B's, kept in
	// user.e2b.* extended attributes).
	Metadata map[string]string `json:"metadata,omitempty"`
}

func (c *Client) filesURL(sandboxID, suffix string, q url.Values) string {
	return c.url("/v1/sandboxes/"+url.PathEscape(sandboxID)+"/files"+suffix, q)
}

// rawRequest sends body as it is (of contentType) and returns the answer
// unread; an error status is the API's error.
func (c *Client) rawRequest(ctx context.Context, method, u, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	hc := *c.http
	hc.Timeout = 0 // transfers take as long as they take; ctx bounds them
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return nil, apiError(resp.StatusCode, b)
	}
	return resp, nil
}

// ReadFile streams a file from a sandbox into w.
func (c *Client) ReadFile(ctx context.Context, sandboxID, path string, w io.Writer) (int64, error) {
	resp, err := c.rawRequest(ctx, http.MethodGet, c.filesURL(sandboxID, "", url.Values{"path": {path}}), "", nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	n, err := io.Copy(w, resp.Body)
	if err == nil && resp.ContentLength >= 0 && n != resp.ContentLength {
		err = fmt.Errorf("file transfer ended after %d of %d bytes", n, resp.ContentLength)
	}
	return n, err
}

// WriteFile streams r into a file in a sandbox. mode is octal ("" = 0644).
func (c *Client) WriteFile(ctx context.Context, sandboxID, path, mode string, r io.Reader) (*Entry, error) {
	q := url.Values{"path": {path}}
	if mode != "" {
		q.Set("mode", mode)
	}
	resp, err := c.rawRequest(ctx, http.MethodPut, c.filesURL(sandboxID, "", q), "application/octet-stream", r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var e Entry
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		return nil, fmt.Errorf("decode entry: %w", err)
	}
	return &e, nil
}

// ListFiles lists a directory to depth.
func (c *Client) ListFiles(ctx context.Context, sandboxID, path string, depth int) ([]Entry, error) {
	var out struct {
		Items []Entry `json:"items"`
	}
	q := url.Values{"path": {path}, "depth": {fmt.Sprint(depth)}}
	if _, err := c.Do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/files:list", q, "", nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

func (c *Client) sessionPost(ctx context.Context, s *Session, suffix string, body []byte) error {
	u := strings.TrimSuffix(s.Attach.URL, "/events") + suffix
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.Attach.Token)
	req.Header.Set("Idempotency-Key", NewIdempotencyKey())
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return apiError(resp.StatusCode, b)
	}
	return nil
}

// SendStdin writes data to the session's stdin.
func (c *Client) SendStdin(ctx context.Context, s *Session, data []byte) error {
	return c.sessionPost(ctx, s, "/stdin", data)
}

// CloseStdin closes the session's stdin.
func (c *Client) CloseStdin(ctx context.Context, s *Session) error {
	return c.sessionPost(ctx, s, "/stdin:close", nil)
}

// StatFile describes one path in the sandbox (a symlink: what it leads to).
func (c *Client) StatFile(ctx context.Context, sandboxID, path string) (*Entry, error) {
	var e Entry
	if _, err := c.Do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/files:stat", url.Values{"path": {path}}, "", nil, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// RemoveFile removes path; a directory with entries only when recursive.
func (c *Client) RemoveFile(ctx context.Context, sandboxID, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	_, err := c.Do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/files", q, "", nil, nil)
	return err
}

// MakeDir makes a directory and its parents; mode is octal ("0755"), ""
// for the default.
func (c *Client) MakeDir(ctx context.Context, sandboxID, path, mode string) (*Entry, error) {
	var e Entry
	body := map[string]string{"path": path}
	if mode != "" {
		body["mode"] = mode
	}
	if _, err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/files:mkdir", nil, "", body, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// MoveFile renames from to to inside the sandbox.
func (c *Client) MoveFile(ctx context.Context, sandboxID, from, to string) (*Entry, error) {
	var e Entry
	if _, err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/files:move", nil, "", map[string]string{"from": from, "to": to}, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// Process is a command session's process.
type Process struct {
	ID        string     `json:"id"`
	State     string     `json:"state"` // running, exited
	Command   []string   `json:"command"`
	Cwd       string     `json:"cwd,omitempty"`
	PTY       bool       `json:"pty"`
	PID       int        `json:"pid,omitempty"`
	User      string     `json:"user,omitempty"`
	ExitCode  *int       `json:"exit_code"`
	Signal    *string    `json:"signal"`
	Error     *ErrorInfo `json:"error"`
	StartedAt *time.Time `json:"started_at"`
	ExitedAt  *time.Time `json:"exited_at"`
	CreatedAt time.Time  `json:"created_at"`
}

// ListProcesses lists the sandbox's command sessions' processes.
func (c *Client) ListProcesses(ctx context.Context, sandboxID string) ([]Process, error) {
	var out struct {
		Items []Process `json:"items"`
	}
	if _, err := c.Do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/processes", nil, "", nil, &out); err != nil {
		return nil, err
	}
	return out.Items, nil
}

// GetProcess reads one process (an exited one keeps its exit for a while).
func (c *Client) GetProcess(ctx context.Context, sandboxID, processID string) (*Process, error) {
	var p Process
	if _, err := c.Do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/processes/"+url.PathEscape(processID), nil, "", nil, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// SignalProcess sends signal ("SIGTERM", "SIGKILL", "SIGINT", …) to a
// process.
func (c *Client) SignalProcess(ctx context.Context, sandboxID, processID, signal string) error {
	_, err := c.Do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(sandboxID)+"/processes/"+url.PathEscape(processID)+":signal", nil, "", map[string]string{"signal": signal}, nil)
	return err
}
