// One sandbox: its record (live), lifecycle buttons whose operations show
// progress, a terminal, files, the network policy, processes, operations
// and usage charts.
import { api, watch, waitOperation } from '../api.js';
import { h, clear, stateBadge, ago, time, bytes, toast, confirmDialog, announce, section, table, took } from '../ui.js';
import { lifecycle, canWrite } from './sandboxes.js';
import { terminalPanel } from '../terminal.js';
import { filesPanel } from './files.js';
import { networkPanel } from './network.js';
import { lineChart } from '../chart.js';

const BUTTONS = [
  ['pause', 'Pause', ['running']],
  ['suspend', 'Suspend', ['running', 'paused']],
  ['wake', 'Wake', ['paused', 'suspended']],
  ['delete', 'Delete', ['starting', 'running', 'paused', 'suspended', 'failed']],
];

function opRow(op) {
  const spent = op.completed_at ? took(Date.parse(op.completed_at) - Date.parse(op.created_at)) : '…';
  return h('tr', { dataset: { op: op.id, state: op.state } },
    h('td', {}, time(op.created_at)),
    h('td', {}, op.kind),
    h('td', {}, h('span', { class: `badge op-${op.state}` }, op.state)),
    h('td', { class: 'num' }, spent),
    h('td', {}, op.error ? `${op.error.code}: ${op.error.message}` : ''));
}

export async function sandboxPage(main, [id], signal) {
  let sb = await api('GET', `/v1/sandboxes/${id}`, { signal });
  const head = h('div', { class: 'page-head' });
  const details = h('dl', { class: 'details', id: 'details' });
  const progress = h('p', { id: 'op-progress', class: 'progress', 'aria-live': 'polite' });
  const buttons = BUTTONS.map(([action, label]) => h('button', {
    type: 'button', id: `do-${action}`, class: action === 'delete' ? 'danger' : '',
    onclick: () => act(action, label),
  }, label));
  const opsBody = h('tbody', { id: 'ops' });
  const ops = new Map();
  const term = terminalPanel(id, signal);
  const procs = h('div', { id: 'processes' });
  const charts = h('div', { class: 'charts', id: 'charts' });
  const network = networkPanel(id, { signal, onSaved: (rec) => { sb = rec; paint(); } });

  function paint() {
    clear(head, h('h1', { class: 'mono' }, sb.id), stateBadge(sb.state));
    head.querySelector('.badge').id = 'sandbox-state';
    const meta = Object.entries(sb.metadata || {});
    const net = sb.network;
    clear(details,
      ...[
        ['Template', `${sb.template?.ref || ''}`],
        ['Runtime', sb.runtime],
        ['Resources', `${sb.resources?.vcpus} vCPU · ${sb.resources?.memory_mib} MiB memory · ${sb.resources?.disk_mib} MiB disk`],
        ['Created', `${time(sb.created_at)} (${ago(sb.created_at)} ago)`],
        ['Last active', sb.last_active_at ? `${ago(sb.last_active_at)} ago` : '—'],
        ['Expires', sb.expires_at ? time(sb.expires_at) : 'no timeout running'],
        ['Network', net ? `egress ${net.egress || 'default'}${net.allow?.length ? ` · allow ${net.allow.join(', ')}` : ''}${net.deny?.length ? ` · deny ${net.deny.join(', ')}` : ''}` : 'none'],
        ['Forked from', sb.fork_of || '—'],
        ['Metadata', meta.length ? meta.map(([k, v]) => `${k}=${v}`).join(', ') : '—'],
        ['Error', sb.error ? `${sb.error.code}: ${sb.error.message}` : '—'],
      ].flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
    for (const [i, [, , from]] of BUTTONS.entries()) buttons[i].disabled = !canWrite() || !from.includes(sb.state);
    network.update(sb);
  }

  function showOp(op) {
    ops.set(op.id, op);
    const sorted = [...ops.values()].sort((a, b) => Date.parse(b.created_at) - Date.parse(a.created_at));
    opsBody.replaceChildren(...sorted.map(opRow));
  }

  async function act(action, label) {
    if (action === 'delete' && !(await confirmDialog(`Delete ${sb.id}?`, 'The sandbox and its files are gone for good.', 'Delete'))) return;
    for (const b of buttons) b.disabled = true;
    progress.textContent = `${label}: starting…`;
    progress.dataset.state = 'running';
    try {
      const op = await lifecycle(sb.id, action);
      showOp(op);
      progress.textContent = `${label}: ${op.state}…`;
      const done = await waitOperation(op.id, { signal });
      showOp(done);
      const spent = took(Date.parse(done.completed_at) - Date.parse(done.created_at));
      progress.textContent = done.state === 'succeeded' ? `${label}: succeeded in ${spent}` : `${label}: failed — ${done.error?.message || ''}`;
      progress.dataset.state = done.state;
      announce(progress.textContent);
      if (done.state === 'succeeded' && action === 'wake') term.woke();
    } catch (e) {
      if (e.name === 'AbortError') return;
      progress.textContent = `${label}: ${e.message}`;
      progress.dataset.state = 'failed';
      toast(`${label}: ${e.message}`, 'error');
    }
    try { sb = await api('GET', `/v1/sandboxes/${id}`, { signal }); } catch { /* deleted */ }
    paint();
  }

  async function loadProcs() {
    try {
      const list = await api('GET', `/v1/sandboxes/${id}/processes`, { signal });
      clear(procs, table('Processes', ['PID', 'Command', 'State', 'PTY', 'Started', 'Exit'],
        (list.items || []).map((p) => h('tr', {}, h('td', { class: 'num' }, p.pid ?? ''), h('td', { class: 'mono' }, (p.command || []).join(' ')),
          h('td', {}, p.state), h('td', {}, p.pty ? 'yes' : ''), h('td', {}, time(p.started_at)),
          h('td', {}, p.exit_code ?? p.signal ?? '')))));
    } catch (e) {
      clear(procs, h('p', { class: 'muted' }, sb.state === 'running' ? e.message : `Processes show while the sandbox runs (it is ${sb.state}).`));
    }
  }

  async function loadMetrics() {
    try {
      const m = await api('GET', `/v1/sandboxes/${id}/metrics`, { signal });
      const items = m.items || [];
      if (!items.length) { clear(charts, h('p', { class: 'muted' }, 'No usage samples yet (the server samples running sandboxes every few seconds).')); return; }
      clear(charts,
        lineChart('CPU used (%)', items.map((x) => [Date.parse(x.timestamp), x.cpu_used_pct]), (v) => `${v.toFixed(0)}%`, 100),
        lineChart('Memory used', items.map((x) => [Date.parse(x.timestamp), x.mem_used]), bytes, items[0].mem_total));
    } catch (e) {
      clear(charts, h('p', { class: 'muted' }, e.message));
    }
  }

  paint();
  clear(main,
    h('p', {}, h('a', { href: '#/sandboxes' }, '← Sandboxes')),
    head,
    h('div', { class: 'toolbar', role: 'toolbar', 'aria-label': 'Lifecycle' }, buttons),
    progress,
    h('div', { class: 'sandbox-grid' }, section('Terminal', term.el), section('Details', details)),
    section('Files', filesPanel(id, signal)),
    section('Network', network.el),
    section('Processes', h('button', { type: 'button', onclick: loadProcs }, 'Refresh'), procs),
    section('Operations', table('Operations of this sandbox', ['Started', 'Kind', 'State', 'Took', 'Error'], [], { id: 'ops-table' })),
    section('Usage', charts));
  main.querySelector('#ops-table tbody').replaceWith(opsBody);

  watch({ sandbox_id: id }, (kind, rec) => {
    if (kind === 'sandbox') {
      const was = sb.state;
      sb = rec;
      paint();
      if (was !== 'running' && sb.state === 'running') term.woke();
    } else {
      showOp(rec);
    }
  }, { signal, onReconnect: async () => { sb = await api('GET', `/v1/sandboxes/${id}`, { signal }); paint(); } });

  const list = await api('GET', `/v1/operations?sandbox_id=${id}&limit=500`, { signal });
  for (const op of list.items || []) showOp(op);
  loadProcs();
  loadMetrics();
  const t = setInterval(loadMetrics, 10000);
  signal.addEventListener('abort', () => clearInterval(t));
  main.dataset.ready = 'sandbox';
}
