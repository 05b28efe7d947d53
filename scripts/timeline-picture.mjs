// Draws a few steps of a `--timeline` file (Chrome trace events) as a picture, for the docs:
// one row per track, a box per span, coloured by category, with its name where it fits. The
// way to read a timeline is Perfetto (ui.perfetto.dev) or chrome://tracing; this makes the
// figure in docs/performance.md without them (headless Chromium, puppeteer-core from
// tests/server/node).
//
//   node scripts/timeline-picture.mjs TIMELINE.json OUT.png [first step] [steps]
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const { default: puppeteer } = await import(
  path.join(here, '../tests/server/node/node_modules/puppeteer-core/lib/esm/puppeteer/puppeteer-core.js'));
const [input, output, first = '2', count = '2'] = process.argv.slice(2);
const trace = JSON.parse(fs.readFileSync(input, 'utf8')).traceEvents;
const names = new Map(trace.filter((e) => e.ph === 'M' && e.name === 'thread_name')
  .map((e) => [e.tid, e.args.name]));
const lo = Number(first), hi = lo + Number(count);
const spans = trace.filter((e) => e.ph === 'X' && e.args.step >= lo && e.args.step < hi);
const t0 = Math.min(...spans.map((e) => e.ts)), t1 = Math.max(...spans.map((e) => e.ts + e.dur));
const tids = [...new Set(spans.map((e) => e.tid))].sort((a, b) => a - b);
const colour = { step: '#9aa5b1', layer: '#5b8def', wait: '#e8a33d', 'cpu experts': '#53b36b',
                 device: '#b57edc', 'device copy or wait': '#e06c75', model: '#5bc0be' };
const W = 1400, row = 34, left = 150, H = 40 + row * tids.length;
let svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="11">`;
svg += `<text x="8" y="18" font-size="13">steps ${lo}-${hi - 1}, ${((t1 - t0) / 1000).toFixed(2)} ms</text>`;
tids.forEach((tid, i) => {
  const y = 30 + i * row;
  svg += `<text x="8" y="${y + 20}">${names.get(tid) ?? tid}</text>`;
  // nested spans (a layer inside its step) drawn thinner inside their parent
  const mine = spans.filter((e) => e.tid === tid).sort((a, b) => b.dur - a.dur);
  for (const e of mine) {
    const depth = mine.filter((p) => p !== e && p.ts <= e.ts && p.ts + p.dur >= e.ts + e.dur).length;
    const x = left + (e.ts - t0) / (t1 - t0) * (W - left - 10);
    const w = Math.max(0.5, e.dur / (t1 - t0) * (W - left - 10));
    const h = row - 6 - depth * 6, yy = y + 3 + depth * 3;
    svg += `<rect x="${x}" y="${yy}" width="${w}" height="${h}" fill="${colour[e.cat] ?? '#ccc'}" stroke="#fff" stroke-width="0.5"/>`;
    if (w > 7 * e.name.length) svg += `<text x="${x + 2}" y="${yy + h / 2 + 4}" fill="#fff">${e.name}</text>`;
  }
});
svg += '</svg>';
const browser = await puppeteer.launch({ executablePath: '/usr/bin/chromium', headless: true,
                                         args: ['--no-sandbox', '--disable-gpu'] });
const page = await browser.newPage();
await page.setViewport({ width: W, height: H });
await page.setContent(`<body style="margin:0;background:#fff">${svg}</body>`);
await page.screenshot({ path: output });
await browser.close();
