// A terminal: xterm.js over a PTY command session. Output comes from the
// session's event stream on the data plane (here under /console/data/, the
// same origin), keystrokes go to its stdin, and a drop — a suspend, a
// network blip — is resumed with Last-Event-ID, so nothing printed is
// lost or shown twice. Only process_exited (or error) ends it.
import { Terminal } from './vendor/xterm/xterm.mjs';
import { FitAddon } from './vendor/xterm/addon-fit.mjs';
import { api, stream, APIError } from './api.js';
import { h } from './ui.js';

const DATA = '/console/data';

function b64bytes(s) {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export class Console {
  constructor(el, sandboxID, { onStatus = () => {} } = {}) {
    this.el = el;
    this.sandboxID = sandboxID;
    this.onStatus = onStatus;
    this.term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false,
      fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, monospace', theme: { background: '#10151c' } });
    this.fit = new FitAddon();
    this.term.loadAddon(this.fit);
    this.lastID = '';
    this.ended = false;
    this.abort = new AbortController();
    this.text = ''; // what the terminal printed (its tail is in data-text, for tests)
    this.decoder = new TextDecoder();
    this.queue = Promise.resolve();
  }

  status(s) { this.state = s; this.el.dataset.status = s; this.onStatus(s); }

  async open() {
    this.el.replaceChildren();
    this.term.open(this.el);
    this.fit.fit();
    const { cols, rows } = this.term;
    const sess = await api('POST', `/v1/sandboxes/${this.sandboxID}/commands`, {
      body: { command: ['/bin/sh', '-c', 'if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi'], pty: { cols, rows }, stdin: true, env: { TERM: 'xterm-256color' } },
    });
    this.session = sess.session_id;
    this.attach = sess.attach.token;
    this.el.dataset.session = this.session;
    this.term.onData((d) => this.send(d));
    this.el.dataset.size = `${cols}x${rows}`;
    this.term.onResize(({ cols: c, rows: r }) => { this.el.dataset.size = `${c}x${r}`; this.resize(c, r); });
    this.resizeObserver = new ResizeObserver(() => { try { this.fit.fit(); } catch { /* hidden */ } });
    this.resizeObserver.observe(this.el);
    this.follow();
  }

  // follow keeps the event stream open until the process ends.
  async follow() {
    let delay = 250;
    while (!this.ended && !this.abort.signal.aborted) {
      this.status(this.lastID ? 'reconnecting' : 'connecting');
      try {
        await stream(`${DATA}/v1/sessions/${this.session}/events`, this.attach, (ev) => {
          delay = 250;
          if (ev.id) this.lastID = ev.id;
          switch (ev.event) {
            case 'output': {
              const o = JSON.parse(ev.data);
              const b = b64bytes(o.data);
              this.text += this.decoder.decode(b, { stream: true });
              if (this.text.length > 200000) this.text = this.text.slice(-100000);
              this.el.dataset.text = this.text.slice(-4000);
              this.term.write(b);
              break;
            }
            case 'process_exited': {
              const e = JSON.parse(ev.data);
              this.ended = true;
              this.term.write(`\r\n\x1b[2m[process exited${e.signal ? ` by ${e.signal}` : ` with code ${e.exit_code}`}]\x1b[0m\r\n`);
              this.status('exited');
              break;
            }
            case 'error': {
              const e = JSON.parse(ev.data);
              this.ended = true;
              this.term.write(`\r\n\x1b[31m[${e.code}: ${e.message}]\x1b[0m\r\n`);
              this.status('exited');
              break;
            }
            case 'resync_required':
              this.term.write('\r\n\x1b[33m[some output was no longer retained]\x1b[0m\r\n');
              break;
            default:
          }
        }, { signal: this.abort.signal, lastEventID: this.lastID, onOpen: () => this.status('connected') });
      } catch (e) {
        if (this.abort.signal.aborted) return;
        if (e instanceof APIError && (e.status === 401 || e.status === 403 || e.status === 404)) {
          this.ended = true;
          this.status('closed');
          this.term.write(`\r\n\x1b[31m[${e.message}]\x1b[0m\r\n`);
          return;
        }
      }
      if (this.ended) return;
      // Dropped: a suspend ends the stream, and so does a network blip.
      // Reconnect once the sandbox runs again (the page says so when it
      // sees the wake; until then ask the API now and then, which costs
      // nothing, rather than knocking on a data plane that must refuse).
      this.status('reconnecting');
      for (;;) {
        await new Promise((r) => { this.poke = r; setTimeout(r, delay); });
        delay = Math.min(delay * 2, 5000);
        if (this.abort.signal.aborted) return;
        try {
          const sb = await api('GET', `/v1/sandboxes/${this.sandboxID}`, { signal: this.abort.signal });
          if (sb.state === 'running') break;
          if (sb.state === 'deleted' || sb.state === 'failed') {
            this.ended = true;
            this.status('closed');
            return;
          }
        } catch (e) {
          if (this.abort.signal.aborted || (e instanceof APIError && e.status === 401)) return;
        }
      }
    }
  }

  // reconnect asks a waiting stream to look again at once (the sandbox woke).
  reconnect() { if (this.poke) this.poke(); }

  // send writes keystrokes to stdin, in order.
  send(data) {
    const body = new TextEncoder().encode(data);
    this.queue = this.queue.then(async () => {
      for (let i = 0; i < 20 && !this.ended; i++) {
        try {
          await fetch(`${DATA}/v1/sessions/${this.session}/stdin`, {
            method: 'POST', body,
            headers: { Authorization: `Bearer ${this.attach}`, 'Content-Type': 'application/octet-stream', 'Idempotency-Key': crypto.randomUUID() },
          }).then((r) => { if (!r.ok && r.status >= 500) throw new Error(String(r.status)); });
          return;
        } catch {
          await new Promise((r) => setTimeout(r, 500)); // suspended or waking: keep the keystrokes
        }
      }
    });
  }

  async resize(cols, rows) {
    if (!this.session || this.ended) return;
    try {
      await fetch(`${DATA}/v1/sessions/${this.session}:resize`, {
        method: 'POST', body: JSON.stringify({ cols, rows }),
        headers: { Authorization: `Bearer ${this.attach}`, 'Content-Type': 'application/json', 'Idempotency-Key': crypto.randomUUID() },
      });
    } catch { /* the next resize will do */ }
  }

  focus() { this.term.focus(); }

  close() {
    this.abort.abort();
    if (this.resizeObserver) this.resizeObserver.disconnect();
    this.term.dispose();
  }
}

export function terminalPanel(sandboxID, signal) {
  const box = h('div', { class: 'terminal', id: 'terminal', role: 'region', 'aria-label': 'Terminal' },
    h('p', { class: 'hint' }, 'Open a terminal to run a login shell in the sandbox (a PTY session: it survives a suspend and wake).'));
  const status = h('span', { id: 'terminal-status', class: 'muted', 'aria-live': 'polite' }, 'not open');
  let con = null;
  const openBtn = h('button', { type: 'button', id: 'terminal-open', onclick: async () => {
    if (con) con.close();
    openBtn.disabled = true;
    con = new Console(box, sandboxID, { onStatus: (s) => { status.textContent = s; } });
    try {
      await con.open();
      con.focus();
    } catch (e) {
      status.textContent = `cannot open: ${e.message}`;
    } finally {
      openBtn.disabled = false;
      openBtn.textContent = 'New terminal';
    }
  } }, 'Open terminal');
  signal.addEventListener('abort', () => { if (con) con.close(); });
  return {
    el: h('div', {}, h('div', { class: 'toolbar' }, openBtn, h('span', {}, 'Status: '), status), box),
    woke() { if (con) con.reconnect(); },
  };
}
