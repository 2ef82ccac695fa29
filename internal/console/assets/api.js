// The console's only way to the server: the public API, with the token the
// user typed in. The token lives in this tab's sessionStorage (gone when
// the tab closes) and travels only in the Authorization header.

const KEY = 'space.token';

export function token() { return sessionStorage.getItem(KEY) || ''; }
export function setToken(t) { sessionStorage.setItem(KEY, t); }
export function forget() { sessionStorage.removeItem(KEY); }

export class APIError extends Error {
  constructor(status, code, message, details) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code || '';
    this.details = details || {};
  }
}

// unauthenticated is called when the server no longer takes the token.
let onUnauthenticated = () => {};
export function whenUnauthenticated(fn) { onUnauthenticated = fn; }

// failure reads an error answer. A 401 to the API token logs the console
// out; one to a session's attachment token (the data plane) does not.
async function failure(resp, apiToken = true) {
  let code = '', message = `${resp.status} ${resp.statusText}`, details;
  try {
    const b = await resp.json();
    if (b && b.error) ({ code, message, details } = b.error);
  } catch { /* not JSON */ }
  const err = new APIError(resp.status, code, message, details);
  if (resp.status === 401 && apiToken) onUnauthenticated(err);
  return err;
}

// api calls the control plane. Every change carries a fresh
// Idempotency-Key, so the browser retrying a request never does it twice.
export async function api(method, path, { body, raw, headers = {}, tokenOverride, signal } = {}) {
  const h = { Authorization: `Bearer ${tokenOverride || token()}`, ...headers };
  let payload = body;
  if (body !== undefined && !raw) {
    h['Content-Type'] = 'application/json';
    payload = JSON.stringify(body);
  }
  if (method !== 'GET' && method !== 'HEAD') h['Idempotency-Key'] = crypto.randomUUID();
  const resp = await fetch(path, { method, headers: h, body: payload, signal, cache: 'no-store' });
  if (!resp.ok) throw await failure(resp);
  if (raw === 'response') return resp;
  if (resp.status === 204) return null;
  const ct = resp.headers.get('Content-Type') || '';
  return ct.includes('json') ? resp.json() : resp.text();
}

// pages walks a list's cursor pages, calling each with one page's items.
export async function pages(path, params, each, { limit = 500, signal } = {}) {
  let cursor = '';
  do {
    const q = new URLSearchParams({ ...params, limit: String(limit) });
    if (cursor) q.set('cursor', cursor);
    const page = await api('GET', `${path}?${q}`, { signal });
    each(page.items || []);
    cursor = page.next_cursor || '';
  } while (cursor && !(signal && signal.aborted));
}

// stream reads Server-Sent Events from url with fetch (EventSource cannot
// send an Authorization header) and calls onEvent({id, event, data}). It
// resolves when the stream ends, rejects on an HTTP error; onOpen runs once
// the server has answered.
export async function stream(url, bearer, onEvent, { signal, lastEventID, onOpen, apiToken = false } = {}) {
  const headers = { Authorization: `Bearer ${bearer}`, Accept: 'text/event-stream' };
  if (lastEventID) headers['Last-Event-ID'] = lastEventID;
  const resp = await fetch(url, { headers, signal, cache: 'no-store' });
  if (!resp.ok) throw await failure(resp, apiToken);
  if (onOpen) onOpen();
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '', ev = { id: '', event: '', data: '' };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl).replace(/\r$/, '');
      buf = buf.slice(nl + 1);
      if (line === '') {
        if (ev.event || ev.data) onEvent(ev);
        ev = { id: '', event: '', data: '' };
      } else if (line.startsWith(':')) {
        // keepalive
      } else {
        const i = line.indexOf(':');
        const field = i < 0 ? line : line.slice(0, i);
        const v = i < 0 ? '' : line.slice(i + 1).replace(/^ /, '');
        if (field === 'id') ev.id = v;
        else if (field === 'event') ev.event = v;
        else if (field === 'data') ev.data = ev.data ? `${ev.data}\n${v}` : v;
      }
    }
  }
}

// watch follows GET /v1/events, reconnecting after a drop (each reconnect
// calls onReconnect first, so the page reads its lists again). It stops
// when signal aborts or the token is refused.
export function watch(params, onEvent, { signal, onReconnect = () => {} } = {}) {
  const q = new URLSearchParams(params);
  const url = `/v1/events${q.toString() ? `?${q}` : ''}`;
  let first = true;
  (async () => {
    let delay = 500;
    while (!signal.aborted) {
      try {
        if (!first) onReconnect();
        first = false;
        await stream(url, token(), (ev) => {
          delay = 500;
          if (ev.event === 'error') {
            const e = JSON.parse(ev.data);
            onUnauthenticated(new APIError(401, e.code, e.message));
            return;
          }
          if (ev.event === 'resync') onReconnect(); // changes were dropped: read the lists again
          if (ev.event === 'sandbox' || ev.event === 'operation') onEvent(ev.event, JSON.parse(ev.data));
        }, { signal, apiToken: true });
      } catch (e) {
        if (signal.aborted || (e instanceof APIError && (e.status === 401 || e.status === 403))) return;
      }
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 10000);
    }
  })();
}

// waitOperation long-polls an operation until it ends.
export async function waitOperation(id, { signal } = {}) {
  for (;;) {
    const op = await api('GET', `/v1/operations/${encodeURIComponent(id)}?wait=25s`, { signal });
    if (op.state === 'succeeded' || op.state === 'failed') return op;
  }
}
