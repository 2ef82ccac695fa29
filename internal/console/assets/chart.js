// lineChart draws points [[time ms, value]] as a small SVG line chart.
import { h } from './ui.js';

const NS = 'http://www.w3.org/2000/svg';
function s(tag, attrs = {}) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

export function lineChart(title, points, fmt, maxHint) {
  const W = 480, H = 140, P = 28;
  const t0 = points[0][0], t1 = Math.max(points[points.length - 1][0], t0 + 1);
  const max = Math.max(maxHint || 0, ...points.map((p) => p[1]), 1);
  const x = (t) => P + ((t - t0) / (t1 - t0)) * (W - 2 * P);
  const y = (v) => H - P - (v / max) * (H - 2 * P);
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': `${title}: latest ${fmt(points[points.length - 1][1])}, peak ${fmt(Math.max(...points.map((p) => p[1])))}`, class: 'chart' });
  svg.append(s('line', { x1: P, y1: H - P, x2: W - P, y2: H - P, class: 'axis' }));
  svg.append(s('line', { x1: P, y1: P, x2: P, y2: H - P, class: 'axis' }));
  const top = s('text', { x: P + 4, y: P - 8, class: 'tick' });
  top.textContent = fmt(max);
  svg.append(top);
  svg.append(s('polyline', { points: points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(' '), class: 'series' }));
  return h('figure', { class: 'chart-box' }, svg, h('figcaption', {}, `${title} — latest ${fmt(points[points.length - 1][1])}`));
}
