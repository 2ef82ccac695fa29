// A sandbox's network policy, editable: the egress default, allow and deny
// rules, public ingress, and the ingress token its ports take. Save
// replaces the policy whole, as PUT /v1/sandboxes/{id}/network does; new
// connections follow it at once, established ones carry on.
import { api } from '../api.js';
import { h, clear, toast, announce } from '../ui.js';
import { canWrite } from './sandboxes.js';

const CLOSED = ['deleting', 'deleted', 'failed'];

// rules reads a textarea: one rule per line (commas also separate).
const rules = (text) => text.split(/[\n,]/).map((s) => s.trim()).filter(Boolean);

export function networkPanel(id, { signal, onSaved }) {
  const egress = h('select', { id: 'net-egress' },
    h('option', { value: 'public' }, 'public — anything the rules do not refuse'),
    h('option', { value: 'none' }, 'none — only what allow names'));
  const area = (key) => h('textarea', { id: `net-${key}`, rows: 3, spellcheck: 'false', 'aria-describedby': 'net-help', placeholder: key === 'allow' ? 'pypi.org\n*.pythonhosted.org\n203.0.113.0/24' : '*.example.com' });
  const allow = area('allow');
  const deny = area('deny');
  const pub = h('input', { type: 'checkbox', id: 'net-public' });
  const save = h('button', { type: 'submit', id: 'net-save' }, 'Save policy');
  const status = h('p', { id: 'net-status', class: 'progress', 'aria-live': 'polite' });
  const ingress = h('dd', { id: 'net-ingress', class: 'mono' });
  const fields = [egress, allow, deny, pub, save];
  // dirty: the user has changed the form since it last showed the
  // record; a live update of the record then leaves the form alone.
  let dirty = false;

  const form = h('form', { class: 'network', id: 'net-form',
    oninput: () => { dirty = true; status.textContent = ''; delete status.dataset.state; },
    onsubmit: async (e) => {
      e.preventDefault();
      const body = { egress: egress.value, allow: rules(allow.value), deny: rules(deny.value), public_ingress: pub.checked };
      save.disabled = true;
      try {
        const sb = await api('PUT', `/v1/sandboxes/${id}/network`, { body, signal });
        dirty = false;
        status.textContent = 'Saved: new connections follow the policy now.';
        status.dataset.state = 'succeeded';
        announce(status.textContent);
        onSaved(sb);
      } catch (err) {
        if (err.name === 'AbortError') return;
        const field = err.details?.field && !err.message.includes(err.details.field) ? ` (${err.details.field})` : '';
        status.textContent = `Not saved: ${err.message}${field}`;
        status.dataset.state = 'failed';
        toast(status.textContent, 'error');
      } finally {
        save.disabled = false;
      }
    } },
  h('div', { class: 'net-grid' },
    h('label', { for: 'net-egress' }, 'Egress'), egress,
    h('label', { for: 'net-allow' }, 'Allow'), allow,
    h('label', { for: 'net-deny' }, 'Deny'), deny,
    h('label', { for: 'net-public' }, 'Public ingress'), h('span', {}, pub, ' anyone may reach its ports without the ingress token')),
  h('p', { class: 'help', id: 'net-help' }, 'One rule per line: a CIDR, an address or a domain (', h('code', {}, '*.github.com'),
    ' is every name below it). First match wins: the floor (host, metadata, private ranges, other sandboxes), then allow, then deny, then egress.'),
  h('div', { class: 'toolbar' }, save), status);
  const el = h('div', { id: 'network' }, form, h('dl', { class: 'details' }, h('dt', {}, 'Ingress token'), ingress));

  // update shows sb's policy, unless the user is editing it.
  function update(sb) {
    const n = sb.network;
    if (!n) {
      clear(el, h('p', { class: 'muted' }, 'This sandbox was created without a network.'));
      return;
    }
    const open = canWrite() && !CLOSED.includes(sb.state);
    for (const f of fields) f.disabled = !open;
    ingress.textContent = n.public_ingress ? 'not needed (public ingress)' : (n.ingress_token || '—');
    if (dirty && open) return;
    dirty = false;
    egress.value = n.egress || 'none';
    allow.value = (n.allow || []).join('\n');
    deny.value = (n.deny || []).join('\n');
    pub.checked = !!n.public_ingress;
  }

  return { el, update };
}
