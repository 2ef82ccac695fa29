// A sandbox's files: browse directories, download a file, upload into the
// directory shown. Bytes go through the files API unchanged. The listing
// shows while the sandbox runs.
import { api } from '../api.js';
import { h, clear, bytes, time, toast, announce, table, confirmDialog } from '../ui.js';
import { canWrite } from './sandboxes.js';

const join = (dir, name) => (dir.endsWith('/') ? dir + name : `${dir}/${name}`);
const parent = (dir) => (dir === '/' ? '/' : dir.replace(/\/[^/]*$/, '') || '/');
const q = (path) => new URLSearchParams({ path }).toString();

export function filesPanel(id, signal) {
  let dir = '/root';
  const pathInput = h('input', { id: 'files-path', type: 'text', value: dir, 'aria-label': 'Directory', spellcheck: 'false' });
  const listing = h('div', { id: 'files-list' });
  const upload = h('input', { id: 'files-upload', type: 'file', multiple: true, 'aria-label': 'Upload files into this directory', disabled: !canWrite() });

  async function download(path, name) {
    try {
      const resp = await api('GET', `/v1/sandboxes/${id}/files?${q(path)}`, { raw: 'response', signal });
      const blob = await resp.blob();
      const url = URL.createObjectURL(blob);
      const a = h('a', { href: url, download: name, class: 'sr-only' }, name);
      document.body.append(a);
      a.click();
      a.remove();
      setTimeout(() => URL.revokeObjectURL(url), 60000);
      announce(`Downloaded ${name} (${bytes(blob.size)})`);
    } catch (e) {
      toast(`Download ${name}: ${e.message}`, 'error');
    }
  }

  async function remove(path, name) {
    if (!(await confirmDialog(`Delete ${name}?`, `${path} is removed from the sandbox.`, 'Delete'))) return;
    try {
      await api('DELETE', `/v1/sandboxes/${id}/files?${q(path)}`);
      toast(`Deleted ${name}`);
      load(dir);
    } catch (e) {
      toast(`Delete ${name}: ${e.message}`, 'error');
    }
  }

  async function load(to) {
    try {
      const list = await api('GET', `/v1/sandboxes/${id}/files:list?${q(to)}`, { signal });
      dir = to;
      pathInput.value = dir;
      const items = (list.items || []).sort((a, b) => (a.type === 'dir') === (b.type === 'dir') ? a.name.localeCompare(b.name) : a.type === 'dir' ? -1 : 1);
      const rows = [];
      if (dir !== '/') rows.push(h('tr', {}, h('td', {}, h('button', { type: 'button', class: 'link', onclick: () => load(parent(dir)) }, '..')), h('td', {}, 'dir'), h('td'), h('td'), h('td')));
      for (const e of items) {
        const path = e.path || join(dir, e.name);
        const name = e.type === 'dir'
          ? h('button', { type: 'button', class: 'link', onclick: () => load(path) }, `${e.name}/`)
          : h('button', { type: 'button', class: 'link', 'data-download': e.name, onclick: () => download(path, e.name), 'aria-label': `Download ${e.name}` }, e.name);
        rows.push(h('tr', { dataset: { name: e.name } }, h('td', { class: 'mono' }, name), h('td', {}, e.type), h('td', { class: 'num' }, e.type === 'file' ? bytes(e.size) : ''),
          h('td', {}, time(e.mtime)),
          h('td', {}, canWrite() && e.type !== 'dir' ? h('button', { type: 'button', class: 'link danger', onclick: () => remove(path, e.name), 'aria-label': `Delete ${e.name}` }, 'delete') : '')));
      }
      clear(listing, table(`Files in ${dir}`, ['Name', 'Type', 'Size', 'Modified', ''], rows), list.truncated ? h('p', { class: 'muted' }, 'Listing truncated.') : null);
      listing.dataset.dir = dir;
    } catch (e) {
      clear(listing, h('p', { class: 'muted' }, e.message));
    }
  }

  upload.addEventListener('change', async () => {
    for (const f of upload.files) {
      try {
        await api('PUT', `/v1/sandboxes/${id}/files?${q(join(dir, f.name))}`, { body: f, raw: true, headers: { 'Content-Type': 'application/octet-stream' } });
        toast(`Uploaded ${f.name} (${bytes(f.size)})`);
        announce(`Uploaded ${f.name}`);
      } catch (e) {
        toast(`Upload ${f.name}: ${e.message}`, 'error');
      }
    }
    upload.value = '';
    load(dir);
  });

  const el = h('div', {},
    h('form', { class: 'toolbar', onsubmit: (e) => { e.preventDefault(); load(pathInput.value.trim() || '/'); } },
      h('label', { for: 'files-path' }, 'Directory'), pathInput, h('button', { type: 'submit' }, 'Open'),
      h('label', { for: 'files-upload', class: 'upload' }, 'Upload'), upload),
    listing);
  // show follows the sandbox's state: only a running sandbox answers file
  // calls, so the listing loads when it runs (again after a wake).
  let shown = false;
  function show(state) {
    if (state === 'running') {
      if (!shown) { shown = true; load(dir); }
      return;
    }
    shown = false;
    clear(listing, h('p', { class: 'muted' }, `Files show while the sandbox runs (it is ${state}).`));
  }
  return { el, show };
}
