// The project's snapshots: what each holds and of which sandbox, its size
// and tag; start a sandbox from one, or delete it. The list reads again
// when a snapshot operation ends.
import { api, watch, pages } from '../api.js';
import { h, clear, bytes, time, ago, toast, announce, table, confirmDialog, stateBadge } from '../ui.js';
import { canWrite, canAdmin } from './sandboxes.js';

export async function snapshots(main, _params, signal) {
  const body = h('tbody', { id: 'snapshots-body' });
  const count = h('span', { id: 'snapshot-count', 'aria-live': 'polite' });

  async function start(snap) {
    try {
      const r = await api('POST', '/v1/sandboxes', { body: { snapshot: snap.id } });
      toast(`Creating ${r.sandbox.id} from ${snap.id}…`);
      announce(`Creating ${r.sandbox.id}`);
      location.hash = `#/sandboxes/${r.sandbox.id}`;
    } catch (e) {
      toast(`New sandbox from ${snap.id}: ${e.message}`, 'error');
    }
  }

  async function remove(snap) {
    if (!(await confirmDialog(`Delete ${snap.id}?`, 'Sandboxes started from it keep running; the snapshot is gone for good.', 'Delete'))) return;
    try {
      await api('DELETE', `/v1/snapshots/${snap.id}`);
      toast(`Deleted ${snap.id}`);
      announce(`Deleted ${snap.id}`);
      await load();
    } catch (e) {
      // A tagged snapshot is 409 until untagged: the message says so.
      toast(`Delete ${snap.id}: ${e.message}`, 'error');
    }
  }

  async function untag(snap) {
    try {
      await api('POST', `/v1/snapshots/${snap.id}:untag`, { body: {} });
      toast(`${snap.tag} no longer starts from ${snap.id}`);
      announce(`Untagged ${snap.id}`);
      await load();
    } catch (e) {
      toast(`Untag ${snap.id}: ${e.message}`, 'error');
    }
  }

  // Tag: a ready snapshot as a template name, so creates (and warm pools)
  // of that name start from it.
  const tagSnap = h('select', { id: 'tag-snapshot', 'aria-label': 'Snapshot to tag' });
  const tagRef = h('input', { type: 'text', id: 'tag-ref', placeholder: 'name:tag', spellcheck: 'false', 'aria-label': 'Template name to tag it as' });
  const tagBtn = h('button', { type: 'submit', id: 'tag-do', disabled: !canAdmin() }, 'Tag as template');
  const tagForm = h('form', { class: 'inline', onsubmit: async (e) => {
    e.preventDefault();
    if (!tagSnap.value || !tagRef.value.trim()) return;
    try {
      const snap = await api('POST', `/v1/snapshots/${tagSnap.value}:tag`, { body: { template: tagRef.value.trim() } });
      toast(`${snap.tag} starts from ${snap.id}`);
      announce(`Tagged ${snap.id} as ${snap.tag}`);
      tagRef.value = '';
      await load();
    } catch (err) {
      toast(`Tag ${tagSnap.value}: ${err.message}`, 'error');
    }
  } }, h('label', { for: 'tag-snapshot' }, 'Snapshot'), tagSnap, h('label', { for: 'tag-ref' }, 'as template'), tagRef, tagBtn,
    canAdmin() ? null : h('span', { class: 'muted', id: 'tag-help' }, 'Tagging needs an admin token.'));

  function row(snap) {
    const ready = snap.state === 'ready';
    return h('tr', { dataset: { snapshot: snap.id, name: snap.name || '', state: snap.state } },
      h('td', { class: 'mono small' }, snap.id),
      h('td', {}, snap.name || '—'),
      h('td', {}, stateBadge(snap.state)),
      h('td', { class: 'mono small' }, h('a', { href: `#/sandboxes/${snap.sandbox_id}` }, snap.sandbox_id)),
      h('td', {}, `${snap.template?.ref || ''} (${snap.runtime})`),
      h('td', { class: 'wrap' }, snap.tag ? [h('span', { class: 'mono' }, snap.tag), ' ', h('button', { type: 'button', class: 'link', disabled: !canAdmin(), dataset: { untag: snap.id }, onclick: () => untag(snap) }, 'untag')] : '—'),
      h('td', { class: 'num' }, ready ? bytes(snap.size_bytes) : '—'),
      h('td', { title: time(snap.created_at) }, `${ago(snap.created_at)} ago`),
      h('td', { class: 'wrap' },
        h('button', { type: 'button', class: 'link', disabled: !ready || !canWrite(), dataset: { start: snap.id }, onclick: () => start(snap) }, 'New sandbox'), ' ',
        h('button', { type: 'button', class: 'link danger', disabled: snap.state === 'creating' || !canWrite(), dataset: { delete: snap.id }, onclick: () => remove(snap) }, 'Delete')));
  }

  async function load() {
    const items = [];
    await pages('/v1/snapshots', {}, (page) => items.push(...page), { signal });
    body.replaceChildren(...items.map(row));
    const picked = tagSnap.value;
    tagSnap.replaceChildren(...items.filter((x) => x.state === 'ready').map((x) => h('option', { value: x.id, selected: x.id === picked }, x.name ? `${x.name} (${x.id})` : x.id)));
    count.textContent = `${items.length} snapshot${items.length === 1 ? '' : 's'}`;
  }

  clear(main,
    h('div', { class: 'page-head' }, h('h1', {}, 'Snapshots'), count),
    h('p', { class: 'help' }, 'Take one from a sandbox\'s page. A sandbox started from a snapshot has its memory, processes and files. Tagged as a template, a snapshot starts every create of that name (warm pools too); a tagged snapshot is deleted only once untagged.'),
    tagForm,
    h('div', { class: 'hscroll' }, table('Snapshots', ['ID', 'Name', 'State', 'Sandbox', 'Template (runtime)', 'Tag', 'Size', 'Taken', ''], [], { id: 'snapshots-table' })));
  main.querySelector('#snapshots-table tbody').replaceWith(body);

  watch({}, (kind, rec) => {
    if (kind === 'operation' && rec.kind === 'snapshot' && rec.state !== 'pending' && rec.state !== 'running') load().catch(() => {});
  }, { signal, onReconnect: load });
  await load();
  main.dataset.ready = 'snapshots';
}
