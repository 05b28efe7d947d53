// Streamed tool calls as the official SDKs read them: the streams tandem's writers make of an
// answer with reasoning, text and a tool call whose arguments come piece by piece (written by
// tests/unit/server_writers_test.cpp into TANDEM_SSE_DIR: the demo model does not write tool
// calls, so a server cannot be made to) are served to OpenAI's SDK (beta.chat.completions.stream,
// responses.stream) and Anthropic's (messages.stream, which parses the partial JSON of every
// input_json_delta). Each SDK must see the arguments arrive in many events and assemble the
// stream into the whole answer the same writers give without streaming.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import path from 'node:path';
import fs from 'node:fs';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const dir = process.env.TANDEM_SSE_DIR;
assert.ok(dir, 'TANDEM_SSE_DIR must be set');
const read = (name) => fs.readFileSync(path.join(dir, name), 'utf8');
const routes = {
  '/v1/chat/completions': 'chat',
  '/v1/responses': 'responses',
  '/v1/messages': 'messages',
};
for (const api of Object.values(routes)) {
  for (const ext of ['sse', 'json']) {
    assert.ok(fs.existsSync(path.join(dir, `${api}.${ext}`)), `${api}.${ext} is missing`);
  }
}

let server, url;
const bodies = [];
before(async () => {
  server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => { body += d; });
    req.on('end', () => {
      bodies.push(JSON.parse(body));
      const api = routes[req.url];
      if (!api) {
        res.writeHead(404).end();
        return;
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.end(read(`${api}.sse`));
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  url = `http://127.0.0.1:${server.address().port}`;
});

after(() => new Promise((resolve) => server.close(resolve)));

// What the SDK adds when it finalizes a response (its parsed views of the text and arguments).
const withoutParsed = (x) => JSON.parse(JSON.stringify(
  x, (k, v) => (k === 'parsed' || k === 'parsed_arguments' ? undefined : v)));

const tools = [{ type: 'function', function: { name: 'get_weather',
                                               parameters: { type: 'object' } } }];

test('chat completions: tool-call arguments stream and assemble into the whole message', async () => {
  const whole = JSON.parse(read('chat.json')).choices[0];
  const openai = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'k', maxRetries: 0 });
  const stream = openai.beta.chat.completions.stream({
    model: 'm', messages: [{ role: 'user', content: 'Weather?' }], tools });
  let deltas = 0;
  stream.on('tool_calls.function.arguments.delta', () => { deltas += 1; });
  const final = await stream.finalChatCompletion();
  assert.equal(bodies.at(-1).stream, true);
  assert.ok(deltas > 5, `${deltas} argument deltas`);
  const m = final.choices[0].message;
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content, whole.message.content);
  assert.deepEqual(m.tool_calls.map((t) => ({ id: t.id, type: t.type, function: t.function })),
                   whole.message.tool_calls);
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris' });
});

test('responses: function_call arguments stream and assemble into the whole response', async () => {
  const whole = JSON.parse(read('responses.json'));
  const openai = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'k', maxRetries: 0 });
  const stream = openai.responses.stream({
    model: 'm', input: 'Weather?',
    tools: [{ type: 'function', name: 'get_weather', parameters: { type: 'object' } }] });
  let deltas = 0;
  let snapshot = '';
  stream.on('response.function_call_arguments.delta', (e) => {
    deltas += 1;
    snapshot = e.snapshot;
  });
  const final = await stream.finalResponse();
  assert.ok(deltas > 5, `${deltas} argument deltas`);
  assert.equal(snapshot, whole.output.at(-1).arguments);
  assert.deepEqual(withoutParsed(final.output), whole.output);
  assert.equal(final.status, 'completed');
});

test('messages: input_json deltas parse as partial JSON and assemble into the whole message', async () => {
  const whole = JSON.parse(read('messages.json'));
  const anthropic = new Anthropic({ baseURL: url, apiKey: 'k', maxRetries: 0 });
  const stream = anthropic.messages.stream({
    model: 'm', max_tokens: 64, messages: [{ role: 'user', content: 'Weather?' }],
    tools: [{ name: 'get_weather', input_schema: { type: 'object' } }] });
  const snapshots = [];
  stream.on('inputJson', (partial, snapshot) => { snapshots.push(snapshot); });
  const final = await stream.finalMessage();
  assert.ok(snapshots.length > 5, `${snapshots.length} input_json deltas`);
  // The SDK parsed each prefix: the input grew into the whole one.
  assert.deepEqual(snapshots.at(-1), { city: 'Paris' });
  assert.deepEqual(final.content, whole.content);
  assert.equal(final.stop_reason, 'tool_use');
});
