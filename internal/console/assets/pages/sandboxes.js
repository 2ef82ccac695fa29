// The fleet: a live, virtualised table of the project's sandboxes (pages
// of 500 read from the server as the table scrolls; only the rows in view
// exist in the DOM), filters, create, and bulk lifecycle actions.
import { api, watch } from '../api.js';
import { h, clear, stateBadge, ago, toast, confirmDialog, announce } from '../ui.js';
import { session } from '../app.js';

const ROW = 36; // px, the CSS row height
const STATES = ['', 'starting', 'running', 'pausing', 'paused', 'suspending', 'suspended', 'waking', 'deleting', 'failed'];
const ACTIONS = {
  pause: { label: 'Pause', verb: 'pause', from: ['running'] },
  suspend: { label: 'Suspend', verb: 'suspend', from: ['running', 'paused'] },
  wake: { label: 'Wake', verb: 'wake', from: ['paused', 'suspended'] },
  delete: { label: 'Delete', verb: 'delete', from: null },
};

// lifecycle starts one action on one sandbox and returns its operation.
export async function lifecycle(id, action) {
  const path = `/v1/sandboxes/${id}`;
  const r = action === 'delete' ? await api('DELETE', path) : await api('POST', `${path}:${action}`);
  return r.operation || r;
}

export function canWrite() {
  return session.me && session.me.role !== 'read-only';
}

// canAdmin: templates, warm pools and snapshot tags need admin or owner.
export function canAdmin() {
  return session.me && (session.me.role === 'admin' || session.me.role === 'owner');
}

export async function sandboxes(main, _params, signal) {
  let rows = [], next = '', loading = false, stateFilter = '', textFilter = '';
  let gen = 0; // bumped by reload: a page read for an older filter is dropped
  const byId = new Map();
  const selected = new Set();
  let view = [];

  const count = h('span', { id: 'sandbox-count', 'aria-live': 'polite' }, '');
  const stateSel = h('select', { id: 'filter-state', 'aria-label': 'Filter by state' }, STATES.map((s) => h('option', { value: s }, s || 'every state')));
  const text = h('input', { id: 'filter-text', type: 'search', placeholder: 'id, template, metadata…', 'aria-label': 'Filter by text' });
  const bulk = Object.entries(ACTIONS).map(([k, a]) => h('button', { type: 'button', class: k === 'delete' ? 'danger' : '', disabled: true, dataset: { bulk: k }, onclick: () => runBulk(k) }, a.label));
  const selectAll = h('input', { type: 'checkbox', id: 'select-all', 'aria-label': 'Select every sandbox shown' });
  const tbody = h('tbody', {});
  const top = h('tr', { class: 'spacer', 'aria-hidden': 'true' }, h('td', { colspan: 9 }));
  const bottom = h('tr', { class: 'spacer', 'aria-hidden': 'true' }, h('td', { colspan: 9 }));
  const tableEl = h('table', { class: 'fleet', id: 'sandboxes-table', 'aria-rowcount': '0' },
    h('caption', { class: 'sr-only' }, 'Sandboxes'),
    h('thead', {}, h('tr', {},
      h('th', { scope: 'col', class: 'sel' }, selectAll),
      ['ID', 'State', 'Runtime', 'Template', 'Age', 'Idle', 'vCPU', 'Memory'].map((x) => h('th', { scope: 'col' }, x)))),
    tbody);
  const scroller = h('div', { class: 'scroller', tabindex: '0', 'aria-label': 'Sandboxes table, scrollable' }, tableEl);

  const matches = (sb) => (!stateFilter || sb.state === stateFilter) &&
    (!textFilter || [sb.id, sb.template?.ref, sb.runtime, ...Object.entries(sb.metadata || {}).flat()].some((v) => String(v || '').toLowerCase().includes(textFilter)));

  function refilter() {
    view = rows.filter(matches);
    tableEl.setAttribute('aria-rowcount', String(view.length + 1));
    count.textContent = `${view.length} sandbox${view.length === 1 ? '' : 'es'}${next ? ' (more on scroll)' : ''}`;
    render();
  }

  function rowFor(sb, i) {
    const cb = h('input', { type: 'checkbox', 'aria-label': `Select ${sb.id}`, checked: selected.has(sb.id), onchange: (e) => { if (e.target.checked) selected.add(sb.id); else selected.delete(sb.id); updateBulk(); } });
    const now = Date.now();
    return h('tr', { 'aria-rowindex': String(i + 2), dataset: { id: sb.id, state: sb.state } },
      h('td', { class: 'sel' }, cb),
      h('td', { class: 'mono' }, h('a', { href: `#/sandboxes/${sb.id}` }, sb.id)),
      h('td', {}, stateBadge(sb.state)),
      h('td', {}, sb.runtime),
      h('td', {}, sb.template?.ref || ''),
      h('td', {}, ago(sb.created_at, now)),
      h('td', {}, sb.state === 'running' ? ago(sb.last_active_at, now) : '—'),
      h('td', { class: 'num' }, sb.resources?.vcpus ?? ''),
      h('td', { class: 'num' }, sb.resources?.memory_mib ? `${sb.resources.memory_mib} MiB` : ''));
  }

  function render() {
    const first = Math.max(0, Math.floor(scroller.scrollTop / ROW) - 10);
    const last = Math.min(view.length, first + Math.ceil(scroller.clientHeight / ROW) + 20);
    top.firstChild.style.height = `${first * ROW}px`;
    bottom.firstChild.style.height = `${(view.length - last) * ROW}px`;
    const out = [top];
    for (let i = first; i < last; i++) out.push(rowFor(view[i], i));
    out.push(bottom);
    tbody.replaceChildren(...out);
    if (next && !loading && last >= view.length - 40) loadMore();
  }

  function updateBulk() {
    const sel = rows.filter((r) => selected.has(r.id));
    for (const b of bulk) {
      const a = ACTIONS[b.dataset.bulk];
      b.disabled = !canWrite() || !sel.some((s) => !a.from || a.from.includes(s.state));
    }
    selectAll.checked = view.length > 0 && view.every((r) => selected.has(r.id));
  }

  function upsert(sb, front) {
    const old = byId.get(sb.id);
    if (sb.state === 'deleted') {
      if (old) { rows = rows.filter((r) => r.id !== sb.id); byId.delete(sb.id); selected.delete(sb.id); }
      return;
    }
    if (old) Object.assign(old, sb);
    else { byId.set(sb.id, sb); if (front) rows.unshift(sb); else rows.push(sb); }
  }

  async function loadMore() {
    if (loading) return;
    loading = true;
    const mine = gen;
    try {
      const q = { ...(stateFilter ? { state: stateFilter } : {}) };
      if (next) q.cursor = next;
      const page = await api('GET', `/v1/sandboxes?${new URLSearchParams({ ...q, limit: '500' })}`, { signal });
      if (mine !== gen) return;
      for (const sb of page.items || []) upsert(sb, false);
      next = page.next_cursor || '';
    } finally {
      if (mine === gen) loading = false;
    }
    refilter();
    updateBulk();
  }

  async function reload() {
    gen++;
    rows = []; byId.clear(); next = ''; selected.clear(); loading = false;
    await loadMore();
  }

  async function runBulk(action) {
    const a = ACTIONS[action];
    const ids = rows.filter((r) => selected.has(r.id) && (!a.from || a.from.includes(r.state))).map((r) => r.id);
    if (!ids.length) return;
    const ok = await confirmDialog(`${a.label} ${ids.length} sandbox${ids.length === 1 ? '' : 'es'}?`,
      action === 'delete' ? 'Deleted sandboxes and their files are gone for good.' : `Each gets its own ${a.verb} operation; the table follows them.`, a.label);
    if (!ok) return;
    let failed = 0;
    const queue = [...ids];
    await Promise.all(Array.from({ length: Math.min(8, queue.length) }, async () => {
      for (let id; (id = queue.shift());) {
        try { await lifecycle(id, action); } catch (e) { failed++; toast(`${a.label} ${id}: ${e.message}`, 'error'); }
      }
    }));
    selected.clear();
    updateBulk();
    render();
    const msg = `${a.label}: ${ids.length - failed} started${failed ? `, ${failed} refused` : ''}.`;
    toast(msg);
    announce(msg);
  }

  // Create.
  const tplSel = h('select', { id: 'create-template', 'aria-label': 'Template' });
  const rtSel = h('select', { id: 'create-runtime', 'aria-label': 'Runtime' });
  const egressSel = h('select', { id: 'create-egress', 'aria-label': 'Egress' },
    h('option', { value: '' }, 'server default'), h('option', { value: 'public' }, 'public'), h('option', { value: 'none' }, 'none'));
  const createBtn = h('button', { type: 'submit', id: 'create', disabled: !canWrite() }, 'Create sandbox');
  const createForm = h('form', { class: 'inline', onsubmit: async (e) => {
    e.preventDefault();
    createBtn.disabled = true;
    try {
      const body = {};
      if (tplSel.value) body.template = tplSel.value;
      if (rtSel.value) body.runtime = rtSel.value;
      if (egressSel.value) body.network = { egress: egressSel.value };
      const r = await api('POST', '/v1/sandboxes', { body });
      upsert(r.sandbox, true);
      refilter();
      toast(`Creating ${r.sandbox.id}…`);
      announce(`Creating ${r.sandbox.id}`);
    } catch (err) {
      toast(`Create: ${err.message}`, 'error');
    } finally {
      createBtn.disabled = !canWrite();
    }
  } }, h('label', { for: 'create-template' }, 'Template'), tplSel, h('label', { for: 'create-runtime' }, 'Runtime'), rtSel,
  h('label', { for: 'create-egress' }, 'Egress'), egressSel, createBtn);

  stateSel.addEventListener('change', () => { stateFilter = stateSel.value; reload(); });
  text.addEventListener('input', () => { textFilter = text.value.trim().toLowerCase(); refilter(); updateBulk(); });
  selectAll.addEventListener('change', () => { for (const r of view) { if (selectAll.checked) selected.add(r.id); else selected.delete(r.id); } updateBulk(); render(); });
  let raf = 0;
  scroller.addEventListener('scroll', () => { if (!raf) raf = requestAnimationFrame(() => { raf = 0; render(); }); });
  const ticker = setInterval(render, 5000); // ages and idle times
  signal.addEventListener('abort', () => clearInterval(ticker));

  clear(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Sandboxes'), count),
    createForm,
    h('div', { class: 'toolbar', role: 'toolbar', 'aria-label': 'Filters and bulk actions' },
      h('label', { for: 'filter-state' }, 'State'), stateSel, h('label', { for: 'filter-text' }, 'Find'), text,
      h('span', { class: 'spacer-x' }), h('span', { class: 'muted' }, 'Selected:'), bulk),
    scroller);

  // The live feed first, so nothing written while the first page loads is missed.
  watch({}, (kind, rec) => {
    if (kind !== 'sandbox') return;
    upsert(rec, true);
    refilter();
    updateBulk();
  }, { signal, onReconnect: reload });

  const [tpls, ready] = await Promise.all([api('GET', '/v1/templates', { signal }).catch(() => ({ items: [] })), fetch('/readyz').then((r) => r.json()).catch(() => ({}))]);
  if (!(tpls.items || []).length) tplSel.append(h('option', { value: '' }, 'server default'));
  for (const t of tpls.items || []) tplSel.append(h('option', { value: `${t.name}:${t.tag}`, selected: `${t.name}:${t.tag}` === 'seed:latest' }, `${t.name}:${t.tag}`));
  rtSel.append(h('option', { value: '' }, `default (${ready.default_runtime || '?'})`));
  for (const r of ready.runtimes || []) rtSel.append(h('option', { value: r }, r));
  await loadMore();
  // For the fleet test: navigation start to the first rows shown.
  main.dataset.readyAt = String(Math.round(performance.now()));
  main.dataset.ready = 'sandboxes';
}
