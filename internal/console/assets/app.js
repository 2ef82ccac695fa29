// The console's shell: login, navigation and the hash router. Each page is
// a function (main, params, signal) that renders into main and stops its
// streams when signal aborts (on leaving the page).
import { api, token, setToken, forget, whenUnauthenticated, APIError } from './api.js';
import { h, clear, announce, toast } from './ui.js';
import { overview } from './pages/overview.js';
import { sandboxes } from './pages/sandboxes.js';
import { sandboxPage } from './pages/sandbox.js';
import { operations } from './pages/operations.js';
import { templates } from './pages/templates.js';
import { snapshots } from './pages/snapshots.js';
import { audit } from './pages/audit.js';

const routes = [
  [/^#?\/?$/, overview, 'Overview'],
  [/^#\/sandboxes$/, sandboxes, 'Sandboxes'],
  [/^#\/sandboxes\/(sbx_[a-z2-7]{26})$/, sandboxPage, 'Sandbox'],
  [/^#\/operations$/, operations, 'Operations'],
  [/^#\/snapshots$/, snapshots, 'Snapshots'],
  [/^#\/templates$/, templates, 'Templates'],
  [/^#\/audit$/, audit, 'Audit log'],
];

export const session = { me: null };
let leave = null;

function loginPage(main, message) {
  document.getElementById('nav').hidden = true;
  document.getElementById('who').hidden = true;
  const input = h('input', { id: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false', placeholder: 'space_…', 'aria-describedby': 'token-help' });
  const err = h('p', { class: 'error', id: 'login-error', role: 'alert' }, message || '');
  const submit = async (e) => {
    e.preventDefault();
    const t = input.value.trim();
    if (!t) return;
    try {
      const me = await api('GET', '/v1/token', { tokenOverride: t });
      setToken(t);
      session.me = me;
      input.value = '';
      if (!location.hash || location.hash === '#/login') location.hash = '#/';
      route();
    } catch (e2) {
      err.textContent = e2 instanceof APIError && e2.status === 401 ? 'That token was refused.' : `Cannot log in: ${e2.message}`;
      input.focus();
    }
  };
  clear(main, h('form', { class: 'login card', onsubmit: submit, 'aria-labelledby': 'login-title' },
    h('h1', { id: 'login-title' }, 'Log in to SPACE'),
    h('label', { for: 'token' }, 'API token'),
    input,
    h('p', { id: 'token-help', class: 'help' }, 'Kept in this tab only (session storage) and sent as the bearer token. Make one with ', h('code', {}, 'space token create'), '.'),
    h('button', { type: 'submit', id: 'login' }, 'Log in'),
    err));
  document.title = 'Log in — SPACE console';
  input.focus();
}

async function route() {
  if (leave) { leave.abort(); leave = null; }
  const main = document.getElementById('main');
  if (!token()) { loginPage(main); return; }
  if (!session.me) {
    try {
      session.me = await api('GET', '/v1/token');
    } catch (e) {
      if (e instanceof APIError && e.status === 401) return; // whenUnauthenticated shows the login
      clear(main, h('p', { class: 'error', role: 'alert' }, `Cannot reach the server: ${e.message}`));
      return;
    }
  }
  document.getElementById('nav').hidden = false;
  document.getElementById('who').hidden = false;
  document.getElementById('who-text').textContent = `${session.me.name || session.me.id} · ${session.me.role} · project ${session.me.project}`;
  const hash = location.hash || '#/';
  for (const [re, page, title] of routes) {
    const m = hash.match(re);
    if (!m) continue;
    for (const a of document.querySelectorAll('#nav a')) {
      const cur = hash === a.getAttribute('href') || (a.getAttribute('href') !== '#/' && hash.startsWith(a.getAttribute('href')));
      if (cur) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    leave = new AbortController();
    document.title = `${title} — SPACE console`;
    clear(main);
    try {
      await page(main, m.slice(1), leave.signal);
    } catch (e) {
      if (!(e instanceof APIError && e.status === 401) && e.name !== 'AbortError') {
        main.append(h('p', { class: 'error', role: 'alert' }, e.message));
      }
    }
    return;
  }
  clear(main, h('h1', {}, 'Not found'), h('p', {}, h('a', { href: '#/' }, 'Back to the overview')));
}

whenUnauthenticated((err) => {
  if (!token()) return;
  forget();
  session.me = null;
  if (leave) { leave.abort(); leave = null; }
  loginPage(document.getElementById('main'), `Logged out: ${err.message}`);
  announce('Your token was refused; log in again.');
});

document.getElementById('logout').addEventListener('click', () => {
  forget();
  session.me = null;
  location.hash = '#/';
  route();
  toast('Logged out.');
});
window.addEventListener('hashchange', route);
route();
