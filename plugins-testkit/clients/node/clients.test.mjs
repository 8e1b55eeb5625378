// Copyright (c) CapyCTL authors
// SPDX-License-Identifier: Apache-2.0

// The official OpenAI and Anthropic Node clients against a whole CapyCTL
// role with fake engines (cmd/capyctl TestClients_Official starts
// `capyctl dev` and runs this script). Every check runs against two
// models: one whose engine serves the API itself (the fake vLLM: native)
// and one the router translates to chat (a custom engine).
//
// Environment: CAPYCTL_ENDPOINT (".../v1"), CAPYCTL_API_KEY,
// CAPYCTL_TRANSLATED_MODEL, CAPYCTL_NATIVE_MODEL; CAPYCTL_LIMITED_KEY and
// CAPYCTL_TIGHT_KEY, named keys the test made (one with generous limits
// scoped to the native model, one allowed a single request a minute).

import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';

const endpoint = process.env.CAPYCTL_ENDPOINT;
const apiKey = process.env.CAPYCTL_API_KEY;
const models = { translated: process.env.CAPYCTL_TRANSLATED_MODEL, native: process.env.CAPYCTL_NATIVE_MODEL };
assert.ok(endpoint && apiKey && models.translated && models.native, 'CAPYCTL_ENDPOINT, CAPYCTL_API_KEY and the models are required');

const openai = new OpenAI({ apiKey, baseURL: endpoint, maxRetries: 0, timeout: 120_000 });
// Anthropic's client appends /v1/messages to its base URL and sends the key
// as x-api-key, with anthropic-version.
const anthropic = new Anthropic({ apiKey, baseURL: endpoint.replace(/\/v1\/?$/, ''), maxRetries: 0, timeout: 120_000 });

const weather = {
  type: 'function',
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};
const weatherAnthropic = { name: weather.name, description: weather.description, input_schema: weather.parameters };

let failed = 0;
async function check(name, fn) {
  try {
    await fn();
    console.log(`ok - ${name}`);
  } catch (e) {
    failed++;
    console.log(`not ok - ${name}: ${e?.stack || e}`);
  }
}

for (const [path, model] of Object.entries(models)) {
  // ---------------------------------------------------------------- OpenAI Responses
  await check(`responses.create, previous_response_id, retrieve, delete (${path})`, async () => {
    const first = await openai.responses.create({ model, input: 'Say hello', max_output_tokens: 16 });
    assert.equal(first.object, 'response');
    assert.equal(first.status, 'completed');
    assert.match(first.id, /^resp_/);
    assert.ok(first.output_text.length > 0, 'output_text');
    assert.ok(first.usage.input_tokens > 0 && first.usage.output_tokens > 0, 'usage');
    assert.equal(first.store, true);

    const second = await openai.responses.create({
      model, previous_response_id: first.id, input: [{ role: 'user', content: 'And again' }], max_output_tokens: 16,
    });
    assert.equal(second.previous_response_id, first.id);
    assert.ok(second.usage.input_tokens > first.usage.input_tokens, 'the second turn carries the first');

    const got = await openai.responses.retrieve(first.id);
    assert.equal(got.id, first.id);
    assert.equal(got.output_text, first.output_text);

    await openai.responses.delete(second.id);
    await assert.rejects(openai.responses.retrieve(second.id), (e) => e instanceof OpenAI.NotFoundError);
  });

  await check(`responses.create streamed: the typed events in order (${path})`, async () => {
    const stream = await openai.responses.create({ model, input: 'Stream please', stream: true, max_output_tokens: 64 });
    const types = [];
    let text = '';
    let done;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.completed') done = ev.response;
    }
    assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress', 'response.output_item.added', 'response.content_part.added']);
    assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done', 'response.output_item.done', 'response.completed']);
    assert.ok(types.slice(4, -4).every((t) => t === 'response.output_text.delta'), types.join(' '));
    assert.ok(done && done.status === 'completed' && done.output[0].content[0].text === text, 'the deltas make the final text');
    // Cut at max_output_tokens: response.incomplete, numbered from 0.
    const seq = [];
    let last;
    const again = await openai.responses.create({ model, input: 'Stream please', stream: true, max_output_tokens: 4 });
    for await (const ev of again) {
      seq.push(ev.sequence_number);
      last = ev;
    }
    assert.deepEqual(seq, seq.map((_, i) => i), 'sequence numbers count from 0');
    assert.equal(last.type, 'response.incomplete');
    assert.equal(last.response.incomplete_details.reason, 'max_output_tokens');
  });

  await check(`responses.stream helper: finalResponse (${path})`, async () => {
    const s = openai.responses.stream({ model, input: 'Stream please', max_output_tokens: 8 });
    let deltas = '';
    s.on('response.output_text.delta', (ev) => { deltas += ev.delta; });
    const final = await s.finalResponse();
    assert.equal(final.output_text, deltas);
  });

  await check(`responses: a function call, its output, the final answer (${path})`, async () => {
    const call = await openai.responses.create({ model, input: 'What is the weather in Paris? Use get_weather.', tools: [weather] });
    const fc = call.output.find((o) => o.type === 'function_call');
    assert.ok(fc, `no function call in ${JSON.stringify(call.output)}`);
    assert.equal(fc.name, 'get_weather');
    assert.equal(typeof JSON.parse(fc.arguments).city, 'string');
    const answer = await openai.responses.create({
      model, previous_response_id: call.id, tools: [weather],
      input: [{ type: 'function_call_output', call_id: fc.call_id, output: 'sunny and 21 degrees' }],
    });
    assert.match(answer.output_text, /^Tool result: sunny/);
  });

  await check(`responses: a streamed function call (${path})`, async () => {
    const stream = await openai.responses.create({ model, input: 'Weather in Paris via get_weather', tools: [weather], stream: true });
    let args = '';
    let item;
    for await (const ev of stream) {
      if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
      if (ev.type === 'response.output_item.done') item = ev.item;
    }
    assert.equal(item.type, 'function_call');
    assert.equal(item.arguments, args);
  });

  // ---------------------------------------------------------------- Anthropic Messages
  await check(`messages.create (${path})`, async () => {
    const msg = await anthropic.messages.create({
      model, max_tokens: 16, system: 'Be brief.', messages: [{ role: 'user', content: 'Say hello' }],
    });
    assert.equal(msg.type, 'message');
    assert.equal(msg.role, 'assistant');
    assert.equal(msg.content[0].type, 'text');
    assert.ok(msg.content[0].text.length > 0);
    assert.ok(['end_turn', 'max_tokens'].includes(msg.stop_reason), msg.stop_reason);
    assert.ok(msg.usage.input_tokens > 0 && msg.usage.output_tokens > 0, JSON.stringify(msg.usage));
  });

  await check(`messages.stream (${path})`, async () => {
    const s = anthropic.messages.stream({ model, max_tokens: 12, messages: [{ role: 'user', content: 'Stream please' }] });
    let text = '';
    s.on('text', (t) => { text += t; });
    const final = await s.finalMessage();
    assert.equal(final.content[0].text, text);
    assert.ok(final.usage.output_tokens > 0 && final.usage.input_tokens > 0, JSON.stringify(final.usage));
  });

  await check(`messages: a tool use, its result, the final answer (${path})`, async () => {
    const ask = [{ role: 'user', content: 'What is the weather in Paris? Use get_weather.' }];
    const first = await anthropic.messages.create({ model, max_tokens: 64, tools: [weatherAnthropic], messages: ask });
    assert.equal(first.stop_reason, 'tool_use');
    const use = first.content.find((b) => b.type === 'tool_use');
    assert.ok(use && use.name === 'get_weather' && typeof use.input.city === 'string', JSON.stringify(first.content));
    const second = await anthropic.messages.create({
      model, max_tokens: 64, tools: [weatherAnthropic],
      messages: [...ask, { role: 'assistant', content: first.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny and 21 degrees' }] }],
    });
    assert.equal(second.stop_reason, 'end_turn');
    assert.match(second.content[0].text, /^Tool result: sunny/);
  });

  await check(`messages.stream: a tool use's input in pieces (${path})`, async () => {
    const s = anthropic.messages.stream({ model, max_tokens: 64, tools: [weatherAnthropic], tool_choice: { type: 'any' },
      messages: [{ role: 'user', content: 'Weather please' }] });
    let json = '';
    s.on('inputJson', (partial) => { json += partial; });
    const final = await s.finalMessage();
    const use = final.content.find((b) => b.type === 'tool_use');
    assert.deepEqual(use.input, JSON.parse(json));
  });

  await check(`messages: an unknown model is a 404 (${path})`, async () => {
    await assert.rejects(
      anthropic.messages.create({ model: 'no-such-model', max_tokens: 8, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof Anthropic.NotFoundError && e.status === 404 && e.error?.error?.type === 'not_found_error',
    );
  });
}

await check('messages.countTokens: the engine counts (native)', async () => {
  const messages = [{ role: 'user', content: 'What is the weather in Paris today?' }];
  const count = await anthropic.messages.countTokens({ model: models.native, messages });
  assert.ok(count.input_tokens > 0);
  const msg = await anthropic.messages.create({ model: models.native, max_tokens: 4, messages });
  assert.equal(msg.usage.input_tokens, count.input_tokens, 'the count is the generation\'s prompt');
});

await check('messages.countTokens: an engine without a count route says so (translated)', async () => {
  await assert.rejects(
    anthropic.messages.countTokens({ model: models.translated, messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.code === 'count_tokens_unsupported',
  );
});

// ---------------------------------------------------------------- named keys' limits
const limitedKey = process.env.CAPYCTL_LIMITED_KEY;
const tightKey = process.env.CAPYCTL_TIGHT_KEY;
if (limitedKey && tightKey) {
  await check('chat.completions: a limited key\'s answer carries the rate-limit headers', async () => {
    const limited = new OpenAI({ apiKey: limitedKey, baseURL: endpoint, maxRetries: 0, timeout: 120_000 });
    const { data, response } = await limited.chat.completions
      .create({ model: models.native, messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 })
      .withResponse();
    assert.equal(data.object, 'chat.completion');
    const h = response.headers;
    assert.equal(h.get('x-ratelimit-limit-requests'), '1000');
    assert.equal(h.get('x-ratelimit-remaining-requests'), '999');
    assert.match(h.get('x-ratelimit-reset-requests'), /^\d+(ms|s)$/);
    assert.equal(h.get('x-ratelimit-limit-tokens'), '100000');
    assert.equal(h.get('x-ratelimit-remaining-tokens'), '100000', 'the first answer\'s tokens count from the next request on');
    assert.ok(h.get('x-ratelimit-reset-tokens'));
  });

  await check('chat.completions: over a key\'s requests per minute, a RateLimitError with the headers', async () => {
    const tight = new OpenAI({ apiKey: tightKey, baseURL: endpoint, maxRetries: 0, timeout: 120_000 });
    await tight.chat.completions.create({ model: models.native, messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 });
    await assert.rejects(
      tight.chat.completions.create({ model: models.native, messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 }),
      (e) => e instanceof OpenAI.RateLimitError && e.status === 429 && e.code === 'rate_limited' &&
        Number(e.headers.get('retry-after')) > 0 && e.headers.get('x-ratelimit-remaining-requests') === '0',
    );
  });

  await check('models.list: a scoped key sees its model only; another is a NotFoundError', async () => {
    const limited = new OpenAI({ apiKey: limitedKey, baseURL: endpoint, maxRetries: 0, timeout: 120_000 });
    const ids = [];
    for await (const m of limited.models.list()) ids.push(m.id);
    assert.deepEqual(ids, [models.native]);
    await assert.rejects(
      limited.chat.completions.create({ model: models.translated, messages: [{ role: 'user', content: 'hi' }], max_tokens: 8 }),
      (e) => e instanceof OpenAI.NotFoundError && e.code === 'unknown_model',
    );
  });
}

if (failed > 0) {
  console.log(`${failed} check(s) failed`);
  process.exit(1);
}
console.log('all checks passed');
