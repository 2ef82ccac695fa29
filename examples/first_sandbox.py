#!/usr/bin/env python3
"""Your first SPACE sandbox: create, run a command, inspect, delete.

Standard library only (Python 3.8+). Usage:

    python3 examples/first_sandbox.py                 create, run COMMAND, inspect, ask to delete
    python3 examples/first_sandbox.py inspect RUN_DIR read-only look at a saved run
    python3 examples/first_sandbox.py delete RUN_DIR  delete a kept sandbox (asks first)
    python3 examples/first_sandbox.py suspend RUN_DIR [--pause]
    python3 examples/first_sandbox.py wake RUN_DIR    wake, recheck readiness, run COMMAND again

Configuration comes from SPACE_API_URL, SPACE_DATA_PLANE_URL, SPACE_API_TOKEN
and SPACE_TEMPLATE (default seed:latest). Every run keeps a private run
directory with state.json (each mutation's method, path, body and
Idempotency-Key, written before it is sent, and every returned id) and the
raw event transcripts. Tokens are never written there.
"""

import base64
import ipaddress
import json
import os
import secrets
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

COMMAND = {
    "command": ["sh", "-c", "printf '%s\\n' \"$GREETING\"; pwd"],
    "cwd": "/tmp",
    "env": {"GREETING": "Hello from SPACE"},
    "timeout": "30s",
}
STREAM_TIMEOUT = 45  # seconds the event stream is read at most
OPERATION_TIMEOUT = 300  # seconds an operation is polled at most
REQUEST_TIMEOUT = 30  # seconds one HTTP request may take


class Failure(Exception):
    """A step failed; the run directory is kept for diagnosis."""


# --- configuration --------------------------------------------------------


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin(url, name):
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Failure(f"{name} must be an http(s) URL, got {url!r}")
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise Failure(f"{name} must use HTTPS unless it is a loopback address")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise Failure(f"{name} must be an origin like https://host:port, got {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname}:{port}"


class Config:
    def __init__(self):
        api = os.environ.get("SPACE_API_URL", "")
        data = os.environ.get("SPACE_DATA_PLANE_URL", "")
        self.token = os.environ.get("SPACE_API_TOKEN", "")
        self.template = os.environ.get("SPACE_TEMPLATE", "seed:latest")
        if not api or not data or not self.token:
            raise Failure("set SPACE_API_URL, SPACE_DATA_PLANE_URL and SPACE_API_TOKEN")
        self.api = _origin(api, "SPACE_API_URL")
        self.data = _origin(data, "SPACE_DATA_PLANE_URL")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # a redirect is answered as the error it is


# No environment proxies, no redirects: the token goes only where configured.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


# --- the run directory ----------------------------------------------------


class Run:
    """A private run directory and its state.json."""

    def __init__(self, directory, state):
        self.dir = directory
        self.state = state

    @classmethod
    def new(cls, config):
        directory = tempfile.mkdtemp(prefix="space-first-sandbox-", dir="/tmp")
        os.chmod(directory, 0o700)
        run = cls(directory, {"version": 1, "api_origin": config.api, "data_plane_origin": config.data,
                              "template": config.template, "requests": [], "ids": {}, "transcripts": []})
        run.save()
        return run

    @classmethod
    def load(cls, directory, config):
        path = os.path.join(directory, "state.json")
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        except (OSError, ValueError) as e:
            raise Failure(f"cannot read {path}: {e}")
        if state.get("api_origin") != config.api or state.get("data_plane_origin") != config.data:
            raise Failure(f"{directory} was made against {state.get('api_origin')} / {state.get('data_plane_origin')}, "
                          f"not the configured {config.api} / {config.data}; refusing to use it")
        return cls(directory, state)

    def save(self):
        tmp = os.path.join(self.dir, "state.json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.state, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, os.path.join(self.dir, "state.json"))

    def record_request(self, name, method, path, body, key):
        entry = {"name": name, "method": method, "path": path, "body": body, "idempotency_key": key,
                 "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "outcome": "unknown"}
        self.state["requests"].append(entry)
        self.save()  # before the request is sent
        return entry

    def request(self, name):
        for entry in reversed(self.state["requests"]):
            if entry["name"] == name:
                return entry
        return None

    def set_id(self, name, value, prefix):
        if isinstance(value, str) and value.startswith(prefix) and len(value) > len(prefix):
            self.state["ids"][name] = value
            self.save()

    def id(self, name):
        return self.state["ids"].get(name)


# --- HTTP -----------------------------------------------------------------


class HTTPError(Failure):
    def __init__(self, status, body):
        self.status = status
        self.body = body
        code = message = ""
        try:
            err = json.loads(body).get("error", {})
            code, message = err.get("code", ""), err.get("message", "")
        except (ValueError, AttributeError):
            message = body[:200]
        super().__init__(f"HTTP {status} {code}: {message}".strip())


def api(config, method, path, body=None, key=None):
    """One control-plane request; returns the decoded JSON answer."""
    if not path.startswith("/v1/") or "//" in path or path.endswith("/"):
        raise Failure(f"refusing to build a request for path {path!r}")
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(config.api + path, data=data, method=method)
    req.add_header("Authorization", "Bearer " + config.token)
    req.add_header("Accept", "application/json")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Idempotency-Key", key)
    try:
        with _OPENER.open(req, timeout=REQUEST_TIMEOUT) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raise HTTPError(e.code, e.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError) as e:
        raise Failure(f"{method} {path}: {e}")
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        raise Failure(f"{method} {path}: the answer is not JSON")


def mutate(config, run, name, method, path, body, key=None):
    """A recorded mutation: written to state.json before it is sent."""
    key = key or secrets.token_hex(16)
    entry = run.record_request(name, method, path, body, key)
    try:
        answer = api(config, method, path, body, key)
    except HTTPError as e:
        entry["outcome"] = f"failed: HTTP {e.status}"
        run.save()
        raise
    entry["outcome"] = "answered"
    run.save()
    return answer


def safe_segment(value, prefix):
    if not isinstance(value, str) or not value.startswith(prefix) or not value[len(prefix):].isalnum():
        raise Failure(f"missing or malformed id {value!r}; no URL is built from it")
    return value


def wait_operation(config, run, op_id):
    op_id = safe_segment(op_id, "op_")
    deadline = time.monotonic() + OPERATION_TIMEOUT
    delay = 0.05
    while True:
        op = api(config, "GET", "/v1/operations/" + op_id)
        if op.get("state") == "succeeded":
            return op
        if op.get("state") == "failed":
            err = op.get("error") or {}
            raise Failure(f"operation {op_id} failed: {err.get('code')}: {err.get('message')}")
        if time.monotonic() > deadline:
            raise Failure(f"operation {op_id} did not finish in {OPERATION_TIMEOUT}s (it may still); inspect the run")
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


# --- steps ----------------------------------------------------------------


def create_sandbox(config, run):
    body = {"template": config.template}
    runtime = os.environ.get("SPACE_RUNTIME")
    if runtime:
        body["runtime"] = runtime
    answer = mutate(config, run, "create", "POST", "/v1/sandboxes", body)
    run.set_id("sandbox_id", (answer.get("sandbox") or {}).get("id"), "sbx_")
    run.set_id("create_operation_id", (answer.get("operation") or {}).get("id"), "op_")
    sandbox_id = safe_segment(run.id("sandbox_id"), "sbx_")
    print(f"Sandbox {sandbox_id}: creating (operation {run.id('create_operation_id')})")
    wait_operation(config, run, run.id("create_operation_id"))
    check_ready(config, run)


def check_ready(config, run):
    """Require a running sandbox whose process endpoint answers."""
    sandbox_id = safe_segment(run.id("sandbox_id"), "sbx_")
    sandbox = api(config, "GET", "/v1/sandboxes/" + sandbox_id)
    if sandbox.get("state") != "running":
        raise Failure(f"sandbox {sandbox_id} is {sandbox.get('state')}, not running")
    api(config, "GET", f"/v1/sandboxes/{sandbox_id}/processes")
    print(f"Sandbox {sandbox_id} is running and its process endpoint answers")


def _attach_url(config, url, session_id):
    expected = f"{config.data}/v1/sessions/{session_id}/events"
    parts = urllib.parse.urlsplit(url or "")
    if not parts.scheme or not parts.hostname:
        raise Failure("the attachment URL is missing")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    origin = f"{parts.scheme}://{parts.hostname}:{port}"
    if origin != config.data or parts.path != f"/v1/sessions/{session_id}/events" or parts.query or parts.fragment:
        raise Failure(f"refusing attachment URL {url!r}: not {expected}")
    return expected


def run_command(config, run, label="command"):
    sandbox_id = safe_segment(run.id("sandbox_id"), "sbx_")
    answer = mutate(config, run, label, "POST", f"/v1/sandboxes/{sandbox_id}/commands", COMMAND)
    run.set_id(label + "_session_id", answer.get("session_id"), "proc_")
    run.set_id(label + "_process_id", answer.get("process_id"), "proc_")
    session_id = safe_segment(run.id(label + "_session_id"), "proc_")
    attach = answer.get("attach") or {}
    url = _attach_url(config, attach.get("url"), session_id)
    token = attach.get("token")
    if not token:
        raise Failure("the session came without an attachment token")
    transcript = f"{label}-{session_id}.events"
    run.state["transcripts"].append(transcript)
    run.save()
    print(f"Running {COMMAND['command']} (session {session_id})")
    exit_event = stream(url, token, os.path.join(run.dir, transcript))
    run.state["ids"][label + "_exit_code"] = exit_event
    run.save()
    print("Command completed successfully")


def stream(url, token, transcript_path):
    """Read the event stream; print output; require process_exited 0."""
    req = urllib.request.Request(url, method="GET")
    req.add_header("Authorization", "Bearer " + token)
    req.add_header("Accept", "text/event-stream")
    deadline = time.monotonic() + STREAM_TIMEOUT
    fd = os.open(transcript_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as transcript:
        try:
            resp = _OPENER.open(req, timeout=STREAM_TIMEOUT)
        except urllib.error.HTTPError as e:
            raise HTTPError(e.code, e.read().decode("utf-8", "replace"))
        except (urllib.error.URLError, OSError) as e:
            raise Failure(f"attach: {e}")
        with resp:
            if resp.headers.get_content_type() != "text/event-stream":
                raise Failure("the attachment answered without an event stream")
            event, data = None, []
            while True:
                if time.monotonic() > deadline:
                    raise Failure(f"no process_exited within {STREAM_TIMEOUT}s")
                try:
                    line = resp.readline()
                except OSError as e:
                    raise Failure(f"event stream broke: {e}")
                transcript.write(line)
                transcript.flush()
                if not line:
                    raise Failure("the event stream ended without process_exited: the result is incomplete")
                if not line.endswith(b"\n"):
                    raise Failure("the event stream ended with an incomplete frame")
                text = line.decode("utf-8").rstrip("\n")
                if text.startswith(":"):
                    continue
                if text.startswith("event: "):
                    event = text[7:]
                elif text.startswith("data: "):
                    data.append(text[6:])
                elif text.startswith("id: "):
                    pass
                elif text == "":
                    if event is None:
                        continue
                    payload = json.loads("\n".join(data)) if data else {}
                    if event == "output":
                        chunk = base64.b64decode(payload.get("data", ""), validate=True)
                        out = sys.stderr if payload.get("stream") == "stderr" else sys.stdout
                        out.write(chunk.decode("utf-8", "replace"))
                        out.flush()
                    elif event == "process_exited":
                        code = payload.get("exit_code")
                        if code != 0:
                            raise Failure(f"the command exited with {code}")
                        return code
                    elif event == "error":
                        raise Failure(f"the command failed: {payload.get('code')}: {payload.get('message')}")
                    elif event == "resync_required":
                        raise Failure("output was lost (resync_required); inspect before repeating side effects")
                    else:
                        raise Failure(f"unexpected event {event!r}")
                    event, data = None, []
                else:
                    raise Failure(f"malformed event stream line {text[:80]!r}")


def inspect_run(config, run):
    """Read-only inspection; each failure is printed, none hides the rest."""
    def show(title, fn):
        try:
            print(f"--- {title}")
            print(json.dumps(fn(), indent=2))
        except Failure as e:
            print(f"    inspection failed: {e}")

    show("sandboxes (first page)", lambda: api(config, "GET", "/v1/sandboxes"))
    sandbox_id = run.id("sandbox_id")
    op_id = run.id("create_operation_id")
    if op_id:
        show(f"operation {op_id}", lambda: api(config, "GET", "/v1/operations/" + safe_segment(op_id, "op_")))
    else:
        print("--- no operation id saved; nothing to inspect there")
    if sandbox_id:
        sid = safe_segment(sandbox_id, "sbx_")
        show(f"sandbox {sid}", lambda: api(config, "GET", "/v1/sandboxes/" + sid))
        show("running processes", lambda: api(config, "GET", f"/v1/sandboxes/{sid}/processes"))
    else:
        print("--- no sandbox id saved; nothing to inspect there")


def confirm(question):
    try:
        answer = input(question)
    except EOFError:
        answer = ""
    return answer.strip().lower() in ("y", "yes")


def delete_sandbox(config, run):
    sandbox_id = safe_segment(run.id("sandbox_id"), "sbx_")
    op_id = run.id("delete_operation_id")
    if not op_id:
        earlier = run.request("delete")
        if earlier and earlier.get("outcome") != "answered":
            print(f"warning: an earlier delete's outcome is unknown; retrying it with the same Idempotency-Key "
                  f"({earlier['idempotency_key']}) and body, so it cannot happen twice")
            answer = mutate(config, run, "delete", earlier["method"], earlier["path"], earlier["body"], earlier["idempotency_key"])
        else:
            answer = mutate(config, run, "delete", "DELETE", "/v1/sandboxes/" + sandbox_id, None)
        run.set_id("delete_operation_id", (answer.get("operation") or {}).get("id"), "op_")
        op_id = run.id("delete_operation_id")
    else:
        print(f"resuming the delete operation {op_id}")
    wait_operation(config, run, op_id)
    for name in run.state.get("transcripts", []):
        path = os.path.join(run.dir, os.path.basename(name))
        if os.path.exists(path):
            os.remove(path)
    run.state["transcripts"] = []
    run.state["deleted"] = True
    run.save()
    print(f"Sandbox {sandbox_id} deleted; transcripts removed. {run.dir} remains: remove it when done.")


def lifecycle(config, run, action):
    sandbox_id = safe_segment(run.id("sandbox_id"), "sbx_")
    answer = mutate(config, run, action, "POST", f"/v1/sandboxes/{sandbox_id}:{action}", None)
    run.set_id(action + "_operation_id", (answer.get("operation") or {}).get("id"), "op_")
    wait_operation(config, run, run.id(action + "_operation_id"))
    state = api(config, "GET", "/v1/sandboxes/" + sandbox_id).get("state")
    print(f"Sandbox {sandbox_id}: {action} succeeded; it is {state}")


# --- main -----------------------------------------------------------------


def main(argv):
    try:
        config = Config()
        if len(argv) == 1:
            run = Run.new(config)
            print(f"Run directory: {run.dir}")
            create_sandbox(config, run)
            run_command(config, run)
            inspect_run(config, run)
            if confirm("Delete the sandbox and its transcripts? [y/N] "):
                delete_sandbox(config, run)
            else:
                print(f"Kept. Later: python3 {argv[0]} inspect {run.dir}  /  delete {run.dir}")
            return 0
        if len(argv) >= 3 and argv[1] in ("inspect", "delete", "suspend", "wake"):
            run = Run.load(argv[2], config)
            if argv[1] == "inspect":
                inspect_run(config, run)
            elif argv[1] == "delete":
                if not run.id("sandbox_id"):
                    raise Failure("this run has no sandbox id; nothing to delete")
                if confirm(f"Delete sandbox {run.id('sandbox_id')}? [y/N] "):
                    delete_sandbox(config, run)
                else:
                    print("Not deleted.")
            elif argv[1] == "suspend":
                lifecycle(config, run, "pause" if "--pause" in argv[3:] else "suspend")
            else:
                lifecycle(config, run, "wake")
                check_ready(config, run)
                run_command(config, run, label="command-after-wake")
            return 0
        print(__doc__, file=sys.stderr)
        return 2
    except Failure as e:
        print(f"error: {e}", file=sys.stderr)
        print("Stopped without further changes; the run directory is kept for diagnosis.", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; the run directory is kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv))
