// Templates and their warm pools: sizes, ready counts, and min_ready for
// admins.
import { api } from '../api.js';
import { h, clear, bytes, time, toast, announce, table } from '../ui.js';
import { canAdmin } from './sandboxes.js';

// showPool writes a pool's counts into its cell (dataset.ready for tests
// and scripts, the text for people), from whichever answer is newest.
function showPool(cell, pool) {
  cell.textContent = `${pool.ready} ready, ${pool.starting} starting`;
  cell.dataset.ready = String(pool.ready);
}

export async function templates(main, _params, signal) {
  // follow shows a pool filling or draining until it holds min_ready.
  const follow = async (ref, cell, pool) => {
    const [name, tag] = ref.split(':');
    for (let i = 0; i < 120 && !signal.aborted && (pool.ready !== pool.min_ready || pool.starting > 0); i++) {
      await new Promise((r) => setTimeout(r, 1000));
      try {
        pool = await api('GET', `/v1/warm-pools/${encodeURIComponent(name)}:${encodeURIComponent(tag)}`, { signal });
      } catch {
        return;
      }
      showPool(cell, pool);
    }
  };
  const admin = canAdmin();
  const list = await api('GET', '/v1/templates', { signal });
  const items = list.items || [];
  const pools = await Promise.all(items.map((t) => api('GET', `/v1/warm-pools/${encodeURIComponent(t.name)}:${encodeURIComponent(t.tag)}`, { signal }).catch(() => null)));
  const rows = items.map((t, i) => {
    const ref = `${t.name}:${t.tag}`;
    const p = pools[i];
    const input = h('input', { type: 'number', min: 0, max: 100, value: p ? p.min_ready : 0, 'aria-label': `Warm pool size for ${ref}`, disabled: !admin, class: 'narrow' });
    const readyCell = h('td', { class: 'num pool-ready', dataset: { ready: p ? String(p.ready) : '' } }, p ? `${p.ready} ready, ${p.starting} starting` : '—');
    const save = h('button', { type: 'button', disabled: !admin, onclick: async () => {
      try {
        const np = await api('PUT', `/v1/warm-pools/${encodeURIComponent(t.name)}:${encodeURIComponent(t.tag)}`, { body: { min_ready: Number(input.value) } });
        showPool(readyCell, np);
        toast(`Warm pool of ${ref}: ${np.min_ready}`);
        announce(`Warm pool of ${ref} set to ${np.min_ready}`);
        follow(ref, readyCell, np);
      } catch (e) {
        toast(`${ref}: ${e.message}`, 'error');
      }
    } }, 'Set');
    return h('tr', { dataset: { template: ref } }, h('td', { class: 'mono' }, ref), h('td', {}, t.source), h('td', { class: 'num' }, bytes(t.size_bytes)),
      h('td', {}, time(t.created_at)), h('td', { class: 'mono small' }, t.digest.slice(0, 19)), readyCell, h('td', {}, input, ' ', save));
  });
  clear(main, h('div', { class: 'page-head' }, h('h1', {}, 'Templates and warm pools')),
    admin ? null : h('p', { class: 'muted' }, 'Setting a warm pool needs an admin token.'),
    table('Templates', ['Template', 'Source', 'Size', 'Built', 'Digest', 'Warm pool', 'min_ready'], rows, { id: 'templates-table' }));
  main.dataset.ready = 'templates';
}
