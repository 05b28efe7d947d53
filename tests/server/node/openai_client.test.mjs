// tandem serve driven by the official OpenAI Node.js SDK: chat and completions, streamed and
// not, the model list, errors as the SDK's APIError with their status, the API key.
// Run by ctest (server.openai_node) with TANDEM_BIN and TANDEM_TEST_DATA_DIR set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import fs from 'node:fs';
import OpenAI from 'openai';
import { startServer, stopServer } from './server.mjs';

const bin = process.env.TANDEM_BIN;
const data = process.env.TANDEM_TEST_DATA_DIR;
assert.ok(bin && data, 'TANDEM_BIN and TANDEM_TEST_DATA_DIR must be set');
const model = path.join(data, 'demo', 'tandem-demo-moe-Q4_K_M.gguf');
assert.ok(fs.existsSync(model), `${model} is missing`);
const key = 'node-sdk-key';

let server;
let client;

before(async () => {
  server = await startServer(bin, model, ['--api-key', key, '--parallel', '4']);
  client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: key, maxRetries: 0 });
});

after(async () => {
  await stopServer(server);
});

const name = 'tandem-demo-moe-Q4_K_M.gguf';

function runChat(prompt, n) {
  return execFileSync(bin, ['run', '-m', model, '--chat', '-p', prompt, '-n', String(n)],
                      { stdio: ['ignore', 'pipe', 'ignore'] }).toString().replace(/\n$/, '');
}

test('models lists the served model', async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), [name]);
});

test('chat: greedy answer equals tandem run --chat, streamed or not', async () => {
  const want = runChat('The LORD is my shepherd', 16);
  const req = { model: name, messages: [{ role: 'user', content: 'The LORD is my shepherd' }],
                max_tokens: 16, temperature: 0 };
  const r = await client.chat.completions.create(req);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.content, want);
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 16);
  const s = await client.chat.completions.create({ ...req, stream: true,
                                                   stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  let finish = null;
  for await (const chunk of s) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, want);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 16);
});

test('completions: streamed text equals the whole answer; n and seed', async () => {
  const req = { model: name, prompt: 'And it came to pass', max_tokens: 12, temperature: 0.8,
                seed: 5, n: 2 };
  const r = await client.completions.create(req);
  assert.equal(r.choices.length, 2);
  const s = await client.completions.create({ ...req, stream: true });
  const texts = ['', ''];
  for await (const chunk of s) for (const c of chunk.choices) texts[c.index] += c.text;
  assert.deepEqual(texts, r.choices.map((c) => c.text));
});

test('errors are APIErrors with their status', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: name, messages: [{ role: 'user', content: 'x' }],
                                     temperature: 7 }),
    (e) => e instanceof OpenAI.APIError && e.status === 400 && /temperature/.test(e.message));
  await assert.rejects(
    client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError);
  const wrong = new OpenAI({ baseURL: client.baseURL, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
});
