// Operations of the project, newest first, filtered by kind and outcome,
// with their failure reasons; new ones arrive live.
import { pages, watch } from '../api.js';
import { h, clear, time, took, table } from '../ui.js';

const KINDS = ['', 'create', 'pause', 'suspend', 'wake', 'delete', 'fork', 'snapshot', 'build'];
const STATES = ['', 'pending', 'running', 'succeeded', 'failed'];
const MAX = 5000; // the newest this many are shown

export async function operations(main, _params, signal) {
  const ops = new Map();
  const kindSel = h('select', { id: 'filter-kind', 'aria-label': 'Kind' }, KINDS.map((k) => h('option', { value: k }, k || 'every kind')));
  const stateSel = h('select', { id: 'filter-outcome', 'aria-label': 'Outcome' }, STATES.map((k) => h('option', { value: k }, k || 'every outcome')));
  const body = h('div', { id: 'operations' });
  const count = h('span', { 'aria-live': 'polite' });

  function render() {
    const k = kindSel.value, st = stateSel.value;
    const list = [...ops.values()].filter((o) => (!k || o.kind === k) && (!st || o.state === st))
      .sort((a, b) => Date.parse(b.created_at) - Date.parse(a.created_at)).slice(0, 500);
    count.textContent = `${list.length} shown of ${ops.size}`;
    clear(body, table('Operations', ['Started', 'Kind', 'Target', 'State', 'Took', 'Failure'], list.map((o) => h('tr', { dataset: { op: o.id, state: o.state } },
      h('td', {}, time(o.created_at)), h('td', {}, o.kind),
      h('td', { class: 'mono' }, o.sandbox_id ? h('a', { href: `#/sandboxes/${o.sandbox_id}` }, o.sandbox_id) : (o.template || '')),
      h('td', {}, h('span', { class: `badge op-${o.state}` }, o.state)),
      h('td', { class: 'num' }, o.completed_at ? took(Date.parse(o.completed_at) - Date.parse(o.created_at)) : '…'),
      h('td', { class: 'error-text' }, o.error ? `${o.error.code}: ${o.error.message}` : '')))));
  }
  kindSel.addEventListener('change', render);
  stateSel.addEventListener('change', render);
  clear(main, h('div', { class: 'page-head' }, h('h1', {}, 'Operations'), count),
    h('div', { class: 'toolbar', role: 'toolbar', 'aria-label': 'Filters' }, h('label', { for: 'filter-kind' }, 'Kind'), kindSel, h('label', { for: 'filter-outcome' }, 'Outcome'), stateSel),
    body);
  watch({}, (kind, rec) => { if (kind === 'operation') { ops.set(rec.id, rec); render(); } }, { signal });
  // The list is oldest first: walk it, keeping the newest MAX.
  await pages('/v1/operations', {}, (items) => {
    for (const o of items) ops.set(o.id, o);
    if (ops.size > MAX) {
      const keep = [...ops.values()].sort((a, b) => Date.parse(b.created_at) - Date.parse(a.created_at)).slice(0, MAX);
      ops.clear();
      for (const o of keep) ops.set(o.id, o);
    }
  }, { signal });
  render();
  main.dataset.ready = 'operations';
}
