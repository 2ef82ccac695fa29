// One sandbox: its record (live), lifecycle, fork and snapshot buttons whose
// operations show progress, a terminal, files, the network policy, processes, operations
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
  const forkCount = h('input', { type: 'number', id: 'fork-count', min: 1, max: 16, value: 1, class: 'narrow', 'aria-label': 'How many copies to fork' });
  const forkBtn = h('button', { type: 'button', id: 'do-fork', onclick: () => fork() }, 'Fork');
  const snapName = h('input', { type: 'text', id: 'snapshot-name', placeholder: 'name (optional)', spellcheck: 'false', 'aria-label': 'Snapshot name' });
  const snapBtn = h('button', { type: 'button', id: 'do-snapshot', onclick: () => snapshot() }, 'Snapshot');
  const opsBody = h('tbody', { id: 'ops' });
  const ops = new Map();
  const term = terminalPanel(id, signal);
  const procs = h('div', { id: 'processes' });
  const charts = h('div', { class: 'charts', id: 'charts' });
  const network = networkPanel(id, { signal, onSaved: (rec) => { sb = rec; paint(); } });
  const files = filesPanel(id, signal);

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
    // Fork and snapshot copy a running or paused sandbox.
    forkBtn.disabled = snapBtn.disabled = !canWrite() || !['running', 'paused'].includes(sb.state);
    network.update(sb);
    files.show(sb.state);
  }

  function showOp(op) {
    ops.set(op.id, op);
    const sorted = [...ops.values()].sort((a, b) => Date.parse(b.created_at) - Date.parse(a.created_at));
    opsBody.replaceChildren(...sorted.map(opRow));
  }

  // track runs one operation from start (which returns it) to its end,
  // showing its progress; done(op) adds to the line once it succeeded.
  async function track(label, start, done) {
    for (const b of [...buttons, forkBtn, snapBtn]) b.disabled = true;
    progress.textContent = `${label}: starting…`;
    progress.dataset.state = 'running';
    try {
      const op = await start();
      showOp(op);
      progress.textContent = `${label}: ${op.state}…`;
      const end = await waitOperation(op.id, { signal });
      showOp(end);
      const spent = took(Date.parse(end.completed_at) - Date.parse(end.created_at));
      progress.textContent = end.state === 'succeeded' ? `${label}: succeeded in ${spent}` : `${label}: failed — ${end.error?.message || ''}`;
      if (end.state === 'succeeded' && done) progress.append(...done(end));
      progress.dataset.state = end.state;
      announce(progress.textContent);
      return end;
    } catch (e) {
      if (e.name === 'AbortError') return null;
      progress.textContent = `${label}: ${e.message}`;
      progress.dataset.state = 'failed';
      toast(`${label}: ${e.message}`, 'error');
      return null;
    } finally {
      try { sb = await api('GET', `/v1/sandboxes/${id}`, { signal }); } catch { /* deleted */ }
      paint();
    }
  }

  async function act(action, label) {
    if (action === 'delete' && !(await confirmDialog(`Delete ${sb.id}?`, 'The sandbox and its files are gone for good.', 'Delete'))) return;
    const end = await track(label, () => lifecycle(sb.id, action));
    if (end?.state === 'succeeded' && action === 'wake') term.woke();
  }

  async function fork() {
    const count = Number(forkCount.value) || 1;
    let copies = [];
    await track(`Fork ×${count}`, async () => {
      const r = await api('POST', `/v1/sandboxes/${id}:fork`, { body: { count } });
      copies = (r.sandboxes || []).map((x) => x.id);
      return r.operation;
    }, () => [' — ', ...copies.flatMap((c, i) => [i ? ', ' : '', h('a', { href: `#/sandboxes/${c}`, class: 'mono', dataset: { fork: c } }, c)])]);
  }

  async function snapshot() {
    const body = snapName.value.trim() ? { name: snapName.value.trim() } : {};
    let snap = null;
    const end = await track('Snapshot', async () => {
      const r = await api('POST', `/v1/sandboxes/${id}/snapshots`, { body });
      snap = r.snapshot;
      return r.operation;
    }, () => [' — ', h('a', { href: '#/snapshots', class: 'mono', dataset: { snapshot: snap.id } }, snap.id)]);
    if (end?.state === 'succeeded') snapName.value = '';
  }

  async function signalProc(p, sig) {
    try {
      await api('POST', `/v1/sandboxes/${id}/processes/${p.id}:signal`, { body: { signal: sig } });
      announce(`Sent ${sig} to ${p.pid}`);
      setTimeout(loadProcs, 300);
    } catch (e) {
      toast(`${sig} to ${p.pid}: ${e.message}`, 'error');
    }
  }

  async function loadProcs() {
    if (sb.state !== 'running') {
      clear(procs, h('p', { class: 'muted' }, `Processes show while the sandbox runs (it is ${sb.state}).`));
      return;
    }
    try {
      const list = await api('GET', `/v1/sandboxes/${id}/processes`, { signal });
      // The running ones (the API lists only those).
      clear(procs, table('Processes', ['PID', 'Command', 'State', 'PTY', 'Started', ''],
        (list.items || []).map((p) => h('tr', { dataset: { process: p.id, state: p.state } }, h('td', { class: 'num' }, p.pid ?? ''), h('td', { class: 'mono' }, (p.command || []).join(' ')),
          h('td', {}, p.state), h('td', {}, p.pty ? 'yes' : ''), h('td', {}, time(p.started_at)),
          h('td', {}, p.state === 'running' && canWrite() ? ['SIGTERM', 'SIGKILL'].map((sig) => h('button', { type: 'button', class: 'link danger', dataset: { signal: sig },
            'aria-label': `Send ${sig} to ${(p.command || []).join(' ')}`, onclick: () => signalProc(p, sig) }, sig === 'SIGTERM' ? 'Stop' : 'Kill')) : '')))));
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
    h('div', { class: 'toolbar', role: 'toolbar', 'aria-label': 'Lifecycle' }, buttons,
      h('span', { class: 'spacer-x' }), forkCount, forkBtn, snapName, snapBtn),
    progress,
    h('div', { class: 'sandbox-grid' }, section('Terminal', term.el), section('Details', details)),
    section('Files', files.el),
    section('Network', network.el),
    section('Processes', h('button', { type: 'button', id: 'procs-refresh', onclick: loadProcs }, 'Refresh'), procs),
    section('Operations', table('Operations of this sandbox', ['Started', 'Kind', 'State', 'Took', 'Error'], [], { id: 'ops-table' })),
    section('Usage', charts));
  main.querySelector('#ops-table tbody').replaceWith(opsBody);

  watch({ sandbox_id: id }, (kind, rec) => {
    if (kind === 'sandbox') {
      const was = sb.state;
      sb = rec;
      paint();
      if (was !== 'running' && sb.state === 'running') { term.woke(); loadProcs(); }
      if (was === 'running' && sb.state !== 'running') loadProcs();
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
