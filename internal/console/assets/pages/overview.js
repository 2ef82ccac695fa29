// The overview: the project's sandboxes by state, its use against its
// quotas, the host's capacity and use, and operation latencies (p50/p95)
// from the server's own metrics (/metrics). Refreshed on every change the
// event stream reports, at most every two seconds.
import { api, pages, watch } from '../api.js';
import { h, clear, bytes, section, table } from '../ui.js';
import { session } from '../app.js';

// parseProm reads Prometheus text into [{name, labels, value}].
export function parseProm(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[3] || '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    out.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return out;
}

// quantile interpolates q from cumulative buckets [[le, count]].
export function quantile(q, buckets) {
  buckets.sort((a, b) => a[0] - b[0]);
  const total = buckets.length ? buckets[buckets.length - 1][1] : 0;
  if (!total) return null;
  const rank = q * total;
  let prevLe = 0, prevCount = 0;
  for (const [le, count] of buckets) {
    if (count >= rank) {
      if (le === Infinity) return prevLe;
      return prevLe + (le - prevLe) * ((rank - prevCount) / Math.max(count - prevCount, 1));
    }
    prevLe = le; prevCount = count;
  }
  return prevLe;
}

const ms = (s) => (s === null ? '—' : s < 1 ? `${(s * 1000).toFixed(0)} ms` : `${s.toFixed(2)} s`);

export async function overview(main, _params, signal) {
  const byState = h('div', { id: 'by-state', class: 'tiles' });
  const quota = h('div', { id: 'quota' });
  const host = h('div', { id: 'host', class: 'tiles' });
  const lat = h('div', { id: 'latency' });
  clear(main, h('div', { class: 'page-head' }, h('h1', {}, 'Overview')),
    section('Sandboxes by state', byState),
    section(`Project ${session.me.project}`, quota),
    section('Host', host),
    section('Operations since the server started', lat));

  async function refresh() {
    const [counts, usage, metricsText] = await Promise.all([
      countStates(signal),
      api('GET', `/v1/projects/${encodeURIComponent(session.me.project)}/usage`, { signal }).catch(() => null),
      fetch('/metrics', { signal, cache: 'no-store' }).then((r) => r.text()).catch(() => ''),
    ]);
    const prom = parseProm(metricsText);
    const one = (name) => prom.find((m) => m.name === name)?.value;
    clear(byState, Object.keys(counts).length
      ? Object.entries(counts).sort().map(([st, n]) => h('div', { class: 'tile', dataset: { state: st } }, h('span', { class: 'big' }, String(n)), h('span', {}, st)))
      : h('p', { class: 'muted' }, 'No sandboxes yet. ', h('a', { href: '#/sandboxes' }, 'Create one.')));
    if (usage) {
      const names = Object.keys(usage.usage);
      clear(quota, table('Usage and quotas', ['', 'In use', 'Quota'], names.map((k) => h('tr', {}, h('th', { scope: 'row' }, k.replaceAll('_', ' ')),
        h('td', { class: 'num' }, String(usage.usage[k])), h('td', { class: 'num' }, usage.quotas?.[k] ? String(usage.quotas[k]) : 'none')))));
    }
    const memTotal = one('space_host_memory_bytes'), memAvail = one('space_host_memory_available_bytes');
    const tiles = [
      ['CPUs', one('space_host_cpus') ?? '—'],
      ['Load (1 min)', one('space_host_load1')?.toFixed(2) ?? '—'],
      ['Memory', memTotal ? `${bytes(memTotal - memAvail)} of ${bytes(memTotal)} used` : '—'],
      ['Sandbox memory', bytes(one('space_sandboxes_memory_used_bytes') ?? 0)],
      ['Sandbox CPUs busy', (one('space_sandboxes_cpu_used_cores') ?? 0).toFixed(2)],
      ['Active cap', one('space_sandboxes_max') ? String(one('space_sandboxes_max')) : 'none'],
      ['Server memory', bytes(one('process_resident_memory_bytes'))],
    ];
    clear(host, tiles.map(([k, v]) => h('div', { class: 'tile' }, h('span', { class: 'big' }, String(v)), h('span', {}, k))));
    const hist = {};
    for (const m of prom) {
      if (m.name !== 'space_operation_duration_seconds_bucket') continue;
      const k = `${m.labels.kind} ${m.labels.outcome}`;
      (hist[k] ||= []).push([m.labels.le === '+Inf' ? Infinity : Number(m.labels.le), m.value]);
    }
    const rows = Object.entries(hist).sort().map(([k, b]) => {
      const [kind, outcome] = k.split(' ');
      const n = Math.max(...b.map((x) => x[1]));
      return h('tr', { dataset: { kind } }, h('td', {}, kind), h('td', {}, outcome), h('td', { class: 'num' }, String(n)),
        h('td', { class: 'num' }, ms(quantile(0.5, b))), h('td', { class: 'num' }, ms(quantile(0.95, b))));
    });
    clear(lat, rows.length ? table('Operation latency', ['Kind', 'Outcome', 'Count', 'p50', 'p95'], rows) : h('p', { class: 'muted' }, 'No operations yet.'));
    main.dataset.ready = 'overview';
  }

  let pending = null;
  watch({}, () => {
    if (pending) return;
    pending = setTimeout(() => { pending = null; refresh().catch(() => {}); }, 2000);
  }, { signal });
  signal.addEventListener('abort', () => clearTimeout(pending));
  await refresh();
}

// countStates counts the project's sandboxes by state from the list (the
// server's /metrics counts every project's).
async function countStates(signal) {
  const counts = {};
  await pages('/v1/sandboxes', {}, (items) => {
    for (const sb of items) counts[sb.state] = (counts[sb.state] || 0) + 1;
  }, { signal });
  return counts;
}
