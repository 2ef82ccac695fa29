// The audit log: every authenticated change, allowed or refused — who (token
// and role), what (action and object), when, and how it ended — newest
// first, filtered on the server by action, token and time (the owner may
// name a project). Admins read their project's; the log only grows, so it is
// read when asked, not followed live.
import { pages } from '../api.js';
import { h, clear, time, table, announce } from '../ui.js';
import { canAdmin } from './sandboxes.js';
import { session } from '../app.js';

const SPANS = [['1h', 'the last hour', 3600e3], ['24h', 'the last 24 hours', 86400e3], ['7d', 'the last 7 days', 7 * 86400e3], ['30d', 'the last 30 days', 30 * 86400e3]];
const MAX = 2000; // the newest this many are shown

// target links an object the console has a page for.
function target(id) {
  if (!id) return '';
  if (/^sbx_[a-z2-7]{26}$/.test(id)) return h('a', { href: `#/sandboxes/${id}` }, id);
  return id;
}

export async function audit(main, _params, signal) {
  if (!canAdmin()) {
    clear(main, h('h1', {}, 'Audit log'),
      h('p', { id: 'audit-denied', class: 'help' }, `Reading the audit log needs an admin or owner token; this one is ${session.me.role}.`));
    main.dataset.ready = 'audit';
    return;
  }
  const owner = session.me.role === 'owner';
  const action = h('input', { id: 'audit-action', type: 'search', placeholder: ':pause, DELETE, /network…', spellcheck: 'false', maxlength: '200' });
  const tok = h('input', { id: 'audit-token', type: 'search', placeholder: 'tok_…', spellcheck: 'false' });
  const since = h('select', { id: 'audit-since' }, SPANS.map(([v, label]) => h('option', { value: v, selected: v === '24h' }, label)));
  const outcome = h('select', { id: 'audit-outcome' }, [['', 'every outcome'], ['ok', 'allowed'], ['refused', 'refused']].map(([v, label]) => h('option', { value: v }, label)));
  const project = owner ? h('input', { id: 'audit-project', type: 'search', placeholder: 'every project', spellcheck: 'false' }) : null;
  const status = h('p', { id: 'audit-status', class: 'help', 'aria-live': 'polite' });
  const body = h('div', { id: 'audit', class: 'hscroll' });
  let rows = [];
  let gen = 0; // bumped by each read: a slower older read is dropped

  function render() {
    const o = outcome.value;
    const list = rows.filter((e) => !o || (o === 'ok') === (e.outcome === 'ok'));
    status.dataset.count = String(list.length);
    status.textContent = `${list.length} shown${rows.length >= MAX ? ` (the newest ${MAX})` : ''}`;
    const heads = ['When', 'Outcome', 'Action', 'Object', 'Token', 'Role', ...(owner ? ['Project'] : []), 'Operation', 'Request'];
    clear(body, table('Audit log', heads, list.map((e) => h('tr', { dataset: { action: e.action, outcome: e.outcome, target: e.target || '' } },
      h('td', {}, time(e.at)),
      h('td', {}, h('span', { class: `badge ${e.outcome === 'ok' ? 'op-succeeded' : 'op-failed'}`, title: `HTTP ${e.status}` }, e.outcome)),
      h('td', { class: 'mono wrap' }, e.action),
      h('td', { class: 'mono' }, target(e.target)),
      h('td', { class: 'mono', title: e.token_id }, e.token_name || e.token_id),
      h('td', {}, e.role),
      ...(owner ? [h('td', {}, e.project)] : []),
      h('td', { class: 'mono' }, e.operation || ''),
      h('td', { class: 'mono' }, e.request_id)))));
  }

  async function load() {
    const my = ++gen;
    const span = SPANS.find(([v]) => v === since.value) || SPANS[1];
    const params = { since: new Date(Date.now() - span[2]).toISOString() };
    if (action.value.trim()) params.action = action.value.trim();
    if (tok.value.trim()) params.token_id = tok.value.trim();
    if (project && project.value.trim()) params.project = project.value.trim();
    status.textContent = 'Reading…';
    delete status.dataset.count;
    const got = [];
    try {
      // The log is oldest first: walk it, keeping the newest MAX.
      await pages('/v1/audit', params, (items) => {
        got.push(...items);
        if (got.length > MAX) got.splice(0, got.length - MAX);
      }, { signal });
    } catch (e) {
      if (my === gen && e.name !== 'AbortError') {
        status.textContent = `Cannot read the audit log: ${e.message}`;
        status.dataset.count = 'error';
      }
      return;
    }
    if (my !== gen) return;
    rows = got.reverse();
    render();
    announce(status.textContent);
  }

  const form = h('form', { class: 'toolbar', role: 'search', 'aria-label': 'Audit filters', onsubmit: (e) => { e.preventDefault(); load(); } },
    h('label', { for: 'audit-action' }, 'Action'), action,
    h('label', { for: 'audit-token' }, 'Token id'), tok,
    ...(project ? [h('label', { for: 'audit-project' }, 'Project'), project] : []),
    h('label', { for: 'audit-since' }, 'Since'), since,
    h('label', { for: 'audit-outcome' }, 'Outcome'), outcome,
    h('button', { type: 'submit', id: 'audit-apply' }, 'Show'));
  since.addEventListener('change', load);
  outcome.addEventListener('change', render);
  clear(main, h('div', { class: 'page-head' }, h('h1', {}, 'Audit log')),
    h('p', { class: 'help' }, 'Every authenticated change through the API, the E2B layer and this console, allowed or refused. Never a token, a body or an environment value.'),
    form, status, body);
  await load();
  main.dataset.ready = 'audit';
}
