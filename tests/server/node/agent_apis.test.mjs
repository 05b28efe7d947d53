// tandem serve driven as coding agents drive it: OpenAI's Responses API with the official OpenAI
// Node.js SDK (client.responses.create / .stream) and Anthropic's Messages API with the official
// @anthropic-ai/sdk (client.messages.create / .stream / .countTokens). Greedy answers equal
// `tandem run --chat`; streamed equals whole; a conversation with tool calls and their results
// renders into the prompt Hugging Face's template renders (the golden text); bad requests get
// each API's own error shape and status. Run by ctest (server.agent_apis_node) with TANDEM_BIN
// and TANDEM_TEST_DATA_DIR set.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import fs from 'node:fs';
import { startServer as startServer_, stopServer } from './server.mjs';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const bin = process.env.TANDEM_BIN;
const data = process.env.TANDEM_TEST_DATA_DIR;
assert.ok(bin && data, 'TANDEM_BIN and TANDEM_TEST_DATA_DIR must be set');
const model = path.join(data, 'demo', 'tandem-demo-moe-Q4_K_M.gguf');
const qwen3 = path.join(data, 'templates', 'Qwen-Qwen3-0.6B.jinja');
for (const f of [model, qwen3]) assert.ok(fs.existsSync(f), `${f} is missing`);
const key = 'agent-key';
const name = 'tandem-demo-moe-Q4_K_M.gguf';

const startServer = (args) => startServer_(bin, model, ['--api-key', key, ...args]);

let demo;  // the demo model with its own template
let tools;  // the same with Qwen3's template (tool calls), a longer context
let openai, anthropic, openaiTools, anthropicTools;

before(async () => {
  demo = await startServer(['--parallel', '4']);
  tools = await startServer(['--chat-template', qwen3, '--ctx', '1024']);
  openai = new OpenAI({ baseURL: `${demo.url}/v1`, apiKey: key, maxRetries: 0 });
  anthropic = new Anthropic({ baseURL: demo.url, apiKey: key, maxRetries: 0 });
  openaiTools = new OpenAI({ baseURL: `${tools.url}/v1`, apiKey: key, maxRetries: 0 });
  anthropicTools = new Anthropic({ baseURL: tools.url, apiKey: key, maxRetries: 0 });
});

after(async () => {
  await stopServer(demo);
  await stopServer(tools);
});

function runChat(prompt, n) {
  const args = ['run', '-m', model, '--chat', '-p', prompt, '-n', String(n)];
  return execFileSync(bin, args, { stdio: ['ignore', 'pipe', 'ignore'] }).toString()
    .replace(/\n$/, '');
}

test('responses: greedy answer equals tandem run --chat, whole and streamed', async () => {
  const want = runChat('The LORD is my shepherd', 16);
  const req = { model: name, input: 'The LORD is my shepherd', max_output_tokens: 16,
                temperature: 0, store: false };
  const r = await openai.responses.create(req);
  assert.equal(r.object, 'response');
  assert.equal(r.output_text, want);
  assert.equal(r.status, 'incomplete');
  assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.usage.output_tokens, 16);
  const stream = openai.responses.stream(req);
  let deltas = '';
  const types = [];
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') deltas += ev.delta;
  }
  const final = await stream.finalResponse();
  assert.equal(deltas, want);
  // (the SDK sets output_text on created responses only)
  const text = final.output.filter((o) => o.type === 'message')
    .flatMap((o) => o.content).map((c) => c.text).join('');
  assert.equal(text, want);
  const shape = (out) => out.map((o) => ({ type: o.type, status: o.status, role: o.role,
                                            text: (o.content ?? []).map((c) => c.text) }));
  assert.deepEqual(shape(final.output), shape(r.output));
  assert.equal(types[0], 'response.created');
  assert.equal(types.at(-1), 'response.completed');
  for (const t of ['response.output_item.added', 'response.content_part.added',
                   'response.output_text.done', 'response.output_item.done']) {
    assert.ok(types.includes(t), t);
  }
});

test('responses: instructions and message items equal the chat API', async () => {
  const input = [{ role: 'user', content: [{ type: 'input_text', text: 'In the beginning' }] }];
  const r = await openai.responses.create({ model: name, instructions: 'Be brief.', input,
                                            max_output_tokens: 12, temperature: 0 });
  const c = await openai.chat.completions.create({
    model: name, max_tokens: 12, temperature: 0,
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'In the beginning' }],
  });
  assert.equal(r.output_text, c.choices[0].message.content);
  assert.equal(r.usage.input_tokens, c.usage.prompt_tokens);
});

const conv = JSON.parse(fs.readFileSync(path.join(data, 'templates', 'conversations.json')))
  .tools;

async function goldenTokens() {
  const golden = fs.readFileSync(path.join(data, 'templates', 'expected',
                                           'Qwen-Qwen3-0.6B.tools.txt'), 'utf8');
  const r = await fetch(`${tools.url}/tokenize`, {
    method: 'POST', headers: { Authorization: `Bearer ${key}` },
    body: JSON.stringify({ content: golden, add_special: true }),
  });
  return (await r.json()).tokens.length;
}

test('responses: a tool-use round trip renders as Hugging Face renders it', async () => {
  const [sys, user, call, res1, res2, answer, thanks] = conv.messages;
  const input = [
    { role: 'user', content: user.content },
    ...call.tool_calls.map((t) => ({ type: 'function_call', call_id: t.id, name: t.function.name,
                                     arguments: JSON.stringify(t.function.arguments) })),
    { type: 'function_call_output', call_id: res1.tool_call_id, output: res1.content },
    { type: 'function_call_output', call_id: res2.tool_call_id, output: res2.content },
    { role: 'assistant', content: [{ type: 'output_text', text: answer.content }] },
    { role: 'user', content: thanks.content },
  ];
  const rtools = conv.tools.map((t) => ({ type: 'function', ...t.function }));
  const r = await openaiTools.responses.create({ model: name, instructions: sys.content, input,
                                                 tools: rtools, max_output_tokens: 4,
                                                 temperature: 0 });
  assert.equal(r.usage.input_tokens, await goldenTokens());
  assert.ok(r.output.some((o) => o.type === 'message'));
});

test('messages: greedy answer equals tandem run --chat, whole and streamed', async () => {
  const want = runChat('The LORD is my shepherd', 16);
  const req = { model: name, max_tokens: 16, temperature: 0,
                messages: [{ role: 'user', content: 'The LORD is my shepherd' }] };
  const m = await anthropic.messages.create(req);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.equal(m.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), want);
  assert.equal(m.stop_reason, 'max_tokens');
  assert.equal(m.usage.output_tokens, 16);
  const stream = anthropic.messages.stream(req);
  let deltas = '';
  stream.on('text', (t) => { deltas += t; });
  const final = await stream.finalMessage();
  assert.equal(deltas, want);
  assert.deepEqual(final.content, m.content);
  assert.equal(final.stop_reason, 'max_tokens');
  assert.equal(final.usage.output_tokens, 16);
});

test('messages: system, stop sequences and count_tokens', async () => {
  const messages = [{ role: 'system', content: 'Be brief.' },
                    { role: 'user', content: 'In the beginning' }];
  const want = (await openai.chat.completions.create({
    model: name, max_tokens: 24, temperature: 0, messages })).choices[0].message.content;
  const words = want.split(' ');
  const stop = words[Math.min(3, words.length - 1)];
  const m = await anthropic.messages.create({
    model: name, max_tokens: 24, temperature: 0, system: 'Be brief.', stop_sequences: [stop],
    messages: [{ role: 'user', content: 'In the beginning' }],
  });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(m.content[0].text, want.slice(0, want.indexOf(stop)).trimEnd());
  const count = await anthropic.messages.countTokens({
    model: name, system: 'Be brief.', messages: [{ role: 'user', content: 'In the beginning' }],
  });
  assert.equal(count.input_tokens, m.usage.input_tokens);
});

test('messages: a tool-use round trip renders as Hugging Face renders it', async () => {
  const [sys, user, call, res1, res2, answer, thanks] = conv.messages;
  const messages = [
    { role: 'user', content: user.content },
    { role: 'assistant', content: call.tool_calls.map((t) => ({
      type: 'tool_use', id: t.id, name: t.function.name, input: t.function.arguments })) },
    { role: 'user', content: [
      { type: 'tool_result', tool_use_id: res1.tool_call_id, content: res1.content },
      { type: 'tool_result', tool_use_id: res2.tool_call_id,
        content: [{ type: 'text', text: res2.content }] }] },
    { role: 'assistant', content: answer.content },
    { role: 'user', content: thanks.content },
  ];
  const atools = conv.tools.map((t) => ({ name: t.function.name,
                                          description: t.function.description,
                                          input_schema: t.function.parameters }));
  const golden = await goldenTokens();
  const count = await anthropicTools.messages.countTokens({ model: name, system: sys.content,
                                                           messages, tools: atools });
  assert.equal(count.input_tokens, golden);
  const m = await anthropicTools.messages.create({ model: name, system: sys.content, messages,
                                                   tools: atools, max_tokens: 4,
                                                   temperature: 0 });
  assert.equal(m.usage.input_tokens, golden);
});

test('errors come in each API\'s shape and status', async () => {
  await assert.rejects(
    anthropic.messages.create({ model: name, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.BadRequestError && e.error.type === 'error' &&
      e.error.error.type === 'invalid_request_error' && /max_tokens/.test(e.error.error.message));
  await assert.rejects(
    anthropic.messages.create({ model: 'claude-x', max_tokens: 4,
                                messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
  const noKey = new Anthropic({ baseURL: demo.url, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(
    noKey.messages.create({ model: name, max_tokens: 4, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.AuthenticationError &&
      e.error.error.type === 'authentication_error');
  await assert.rejects(
    openai.responses.create({ model: name, input: 'x', previous_response_id: 'resp_1' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'previous_response_id');
  await assert.rejects(
    openai.responses.create({ model: name, input: 'x', max_output_tokens: 0 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_output_tokens');
  await assert.rejects(
    openai.responses.create({ model: name, input: [{ type: 'web_search_call' }] }),
    (e) => e instanceof OpenAI.BadRequestError && /not supported/.test(e.message));
});
