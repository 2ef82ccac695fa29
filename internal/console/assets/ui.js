// Small DOM helpers. Every text from the API goes in with textContent
// (through h), never as HTML: a sandbox's metadata is its owner's input.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return el;
}

// announce tells screen readers (and the test) what just happened.
export function announce(text) {
  const live = document.getElementById('live');
  live.textContent = text;
}

export function toast(text, kind = 'info') {
  const t = h('div', { class: `toast ${kind}`, role: kind === 'error' ? 'alert' : 'status' }, text);
  document.getElementById('toasts').append(t);
  setTimeout(() => t.remove(), kind === 'error' ? 8000 : 4000);
}

// confirmDialog asks before something that cannot be undone.
export function confirmDialog(title, text, ok = 'Confirm') {
  const dlg = document.getElementById('confirm');
  document.getElementById('confirm-title').textContent = title;
  document.getElementById('confirm-text').textContent = text;
  const okBtn = document.getElementById('confirm-ok');
  const cancel = document.getElementById('confirm-cancel');
  okBtn.textContent = ok;
  return new Promise((resolve) => {
    const done = (v) => {
      okBtn.removeEventListener('click', yes);
      cancel.removeEventListener('click', no);
      dlg.removeEventListener('cancel', no);
      dlg.close();
      resolve(v);
    };
    const yes = () => done(true);
    const no = (e) => { if (e) e.preventDefault(); done(false); };
    okBtn.addEventListener('click', yes);
    cancel.addEventListener('click', no);
    dlg.addEventListener('cancel', no);
    dlg.showModal();
    cancel.focus();
  });
}

export function stateBadge(state) {
  return h('span', { class: `badge state-${state}`, 'data-state': state }, state);
}

export function ago(iso, now = Date.now()) {
  if (!iso) return '—';
  const t = Date.parse(iso);
  if (Number.isNaN(t) || t <= 0) return '—';
  return duration(now - t);
}

export function duration(ms) {
  if (ms < 0) ms = 0;
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const hr = Math.floor(m / 60);
  if (hr < 48) return `${hr}h ${m % 60}m`;
  return `${Math.floor(hr / 24)}d ${hr % 24}h`;
}

// took formats how long an operation took, from ms.
export function took(ms) {
  if (!(ms >= 0)) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return duration(ms);
}

export function bytes(n) {
  if (n === undefined || n === null) return '—';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${u[i]}`;
}

export function time(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? '—' : d.toLocaleString();
}

// table builds a plain table with a caption for screen readers.
export function table(caption, headers, rows, attrs = {}) {
  return h('table', attrs,
    h('caption', { class: 'sr-only' }, caption),
    h('thead', {}, h('tr', {}, headers.map((x) => h('th', { scope: 'col' }, x)))),
    h('tbody', {}, rows));
}

export function section(title, ...children) {
  const id = 'sec-' + title.toLowerCase().replace(/[^a-z]+/g, '-');
  return h('section', { class: 'card', 'aria-labelledby': id }, h('h2', { id }, title), ...children);
}
