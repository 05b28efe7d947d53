// tandem serve's chat page in headless Chromium (Debian's `chromium`, driven by puppeteer-core):
// a prompt typed and sent streams an answer equal to the API's greedy answer; stop interrupts a
// long answer (the page keeps what came, a prefix of the whole answer, and the server cancels the
// request); the API key typed into the settings is used; --no-webui serves no page. With
// TANDEM_SCREENSHOT_DIR set, it saves the page (docs/images/chat-page.png is made so).
// Run by ctest (server.chat_page_node) with TANDEM_BIN and TANDEM_TEST_DATA_DIR set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import fs from 'node:fs';
import { startServer as startServer_, stopServer } from './server.mjs';
import puppeteer from 'puppeteer-core';

const bin = process.env.TANDEM_BIN;
const data = process.env.TANDEM_TEST_DATA_DIR;
assert.ok(bin && data, 'TANDEM_BIN and TANDEM_TEST_DATA_DIR must be set');
const model = path.join(data, 'demo', 'tandem-demo-moe-Q4_K_M.gguf');
assert.ok(fs.existsSync(model), `${model} is missing`);
const chromium = process.env.CHROMIUM ||
  ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => fs.existsSync(p));
assert.ok(chromium, 'chromium is not installed (scripts/bootstrap.sh installs it)');
const key = 'page-key';

const startServer = (args) => startServer_(bin, model, args);

let server, browser, page;

before(async () => {
  server = await startServer(['--api-key', key, '--parallel', '2', '--ctx', '2048']);
  browser = await puppeteer.launch({ executablePath: chromium, headless: true,
                                     args: ['--no-sandbox', '--disable-gpu',
                                            '--disable-dev-shm-usage'] });
  page = await browser.newPage();
  await page.setViewport({ width: 1000, height: 700 });
  await page.goto(server.url + '/', { waitUntil: 'load' });
  await page.click('#toggle-settings');
  for (const [id, value] of [['api-key', key], ['temperature', '0'], ['max-tokens', '24']]) {
    await page.$eval(`#${id}`, (el, v) => {
      el.value = v;
      el.dispatchEvent(new Event('change'));
    }, value);
  }
  await page.click('#toggle-settings');
});

after(async () => {
  if (browser) await browser.close();
  await stopServer(server);
});

async function apiAnswer(messages, maxTokens) {
  const r = await fetch(server.url + '/v1/chat/completions', {
    method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages, max_tokens: maxTokens, temperature: 0 }),
  });
  assert.equal(r.status, 200);
  return (await r.json()).choices[0].message.content;
}

async function metric(name) {
  const r = await fetch(server.url + '/metrics', { headers: { Authorization: `Bearer ${key}` } });
  const line = (await r.text()).split('\n').find((l) => l.startsWith(name + ' '));
  return Number(line.split(' ')[1]);
}

// Types a prompt and sends it with Enter; the new answer's element.
async function ask(prompt) {
  const before = (await page.$$('.msg.assistant')).length;
  await page.type('#prompt', prompt);
  await page.keyboard.press('Enter');
  await page.waitForFunction((n) => document.querySelectorAll('.msg.assistant').length > n, {},
                             before);
  return (await page.$$('.msg.assistant')).at(-1);
}

test('a typed prompt streams the API\'s answer', { timeout: 120000 }, async () => {
  const want = await apiAnswer([{ role: 'user', content: 'The LORD is my shepherd' }], 24);
  const answer = await ask('The LORD is my shepherd');
  await page.waitForFunction((el) => el.dataset.state !== 'streaming', { timeout: 60000 }, answer);
  assert.equal(await answer.evaluate((el) => el.dataset.state), 'done');
  assert.equal(await answer.evaluate((el) => el.dataset.raw), want);
  // Rendered as text (markdown of plain prose: one paragraph per block of lines).
  const shown = await answer.evaluate((el) => el.querySelector('.content').innerText);
  assert.equal(shown.replace(/\s+/g, ' ').trim(), want.replace(/\s+/g, ' ').trim());
  // The second turn carries the first: the API's answer to the whole conversation.
  const want2 = await apiAnswer([{ role: 'user', content: 'The LORD is my shepherd' },
                                 { role: 'assistant', content: want },
                                 { role: 'user', content: 'And then?' }], 24);
  const second = await ask('And then?');
  await page.waitForFunction((el) => el.dataset.state !== 'streaming', { timeout: 60000 }, second);
  assert.equal(await second.evaluate((el) => el.dataset.raw), want2);
  if (process.env.TANDEM_SCREENSHOT_DIR) {
    await page.screenshot({ path: path.join(process.env.TANDEM_SCREENSHOT_DIR, 'chat-page.png') });
  }
});

test('stop interrupts a long answer', { timeout: 120000 }, async () => {
  await page.click('#new-chat');
  await page.click('#toggle-settings');
  await page.$eval('#max-tokens', (el) => { el.value = '2000'; el.dispatchEvent(new Event('change')); });
  await page.click('#toggle-settings');
  const whole = await apiAnswer([{ role: 'user', content: 'In the beginning' }], 2000);
  const answer = await ask('In the beginning');
  await page.waitForFunction((el) => (el.dataset.raw || '').length > 0, { timeout: 60000 }, answer);
  await page.click('#stop');
  await page.waitForFunction((el) => el.dataset.state !== 'streaming', { timeout: 60000 }, answer);
  assert.equal(await answer.evaluate((el) => el.dataset.state), 'stopped');
  const got = await answer.evaluate((el) => el.dataset.raw);
  assert.ok(got.length > 0 && got.length < whole.length, `${got.length} of ${whole.length}`);
  assert.ok(whole.startsWith(got), 'what came before the stop is the answer\'s start');
  // The server saw the hang-up and cancelled the request.
  for (let i = 0; i < 200 && await metric('tandem_requests_running') !== 0; i++) {
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(await metric('tandem_requests_running'), 0);
  assert.equal(await page.$eval('#send', (el) => el.disabled), false);
});

test('the reasoning is shown folded', { timeout: 120000 }, async () => {
  // Qwen3.5's template opens <think> in the generation prompt: the demo model's answer is
  // reasoning (it never closes the block).
  const s = await startServer(['--chat-template',
                               path.join(data, 'templates', 'Qwen3.5-4B.jinja'), '--ctx', '1024']);
  const r = await fetch(s.url + '/v1/chat/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'In the beginning' }],
                           max_tokens: 24, temperature: 0 }),
  });
  const want = (await r.json()).choices[0].message;
  const p = await browser.newPage();
  try {
    assert.ok(want.reasoning_content, 'the API answer has reasoning');
    await p.goto(s.url + '/', { waitUntil: 'load' });
    await p.$eval('#temperature', (el) => { el.value = '0'; el.dispatchEvent(new Event('change')); });
    await p.$eval('#max-tokens', (el) => { el.value = '24'; el.dispatchEvent(new Event('change')); });
    await p.type('#prompt', 'In the beginning');
    await p.keyboard.press('Enter');
    await p.waitForFunction(() => {
      const a = document.querySelector('.msg.assistant');
      return a && a.dataset.state && a.dataset.state !== 'streaming';
    }, { timeout: 60000 });
    const got = await p.$eval('.msg.assistant', (el) => ({
      reasoning: el.dataset.reasoning, content: el.dataset.raw,
      folded: !!el.querySelector('details.reasoning') && !el.querySelector('details.reasoning').open,
    }));
    assert.equal(got.reasoning, want.reasoning_content);
    assert.equal(got.content, want.content ?? '');
    assert.ok(got.folded, 'the reasoning is in a closed <details>');
  } finally {
    await p.close();
    await stopServer(s);
  }
});

test('--no-webui serves no page', async () => {
  const s = await startServer(['--no-webui']);
  assert.equal((await fetch(s.url + '/')).status, 404);
  await stopServer(s);
  const page = await fetch(server.url + '/');
  assert.equal(page.status, 200);
  assert.match(page.headers.get('content-security-policy'), /default-src 'none'/);
});
