// The official `openai` npm package against the router: models, completions and chat
// completions, streamed and not, at temperature 0 (a stream must say what the whole
// response says), vLLM's return_token_ids passed through as an extra body field, the
// goldens' greedy tokens, and OpenAI's error classes for bad requests and bad keys.
import assert from 'node:assert/strict';
import { before, describe, test } from 'node:test';
import OpenAI from 'openai';
import { apiKey, goldensPath, promptIds, readSafetensorsI32, url } from './env.mjs';

const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: apiKey || 'none', maxRetries: 0, timeout: 120_000 });
let model = '';
let hasTokenizer = false;

before(async () => {
  const page = await client.models.list();
  assert.ok(page.data.length > 0, '/v1/models lists no model');
  model = page.data[0].id;
  try {
    await client.completions.create({ model, prompt: 'Hello', max_tokens: 1, temperature: 0 });
    hasTokenizer = true;
  } catch (e) {
    if (!(e instanceof OpenAI.BadRequestError)) throw e;
  }
});

async function streamCompletion(params) {
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const out = { text: '', token_ids: [], finish_reason: null, usage: null, chunks: 0 };
  for await (const chunk of stream) {
    out.chunks++;
    if (chunk.usage) out.usage = chunk.usage;
    for (const c of chunk.choices) {
      out.text += c.text ?? '';
      out.token_ids.push(...(c.token_ids ?? []));
      if (c.finish_reason) out.finish_reason = c.finish_reason;
    }
  }
  return out;
}

describe('openai completions', () => {
  test('token-id prompt: return_token_ids, usage, finish_reason', async () => {
    const prompt = promptIds(10, 1);
    const r = await client.completions.create({ model, prompt, max_tokens: 8, temperature: 0, ignore_eos: true, return_token_ids: true });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.choices[0].token_ids.length, 8);
    assert.equal(r.usage.prompt_tokens, 10);
    assert.equal(r.usage.completion_tokens, 8);
    assert.equal(r.usage.total_tokens, 18);
  });

  test('streamed equals non-streamed at temperature 0', async () => {
    const params = { model, prompt: promptIds(17, 2), max_tokens: 12, temperature: 0, ignore_eos: true, return_token_ids: true };
    const whole = await client.completions.create(params);
    const s = await streamCompletion(params);
    assert.ok(s.chunks >= 2, `only ${s.chunks} chunks`);
    assert.deepEqual(s.token_ids, whole.choices[0].token_ids);
    assert.equal(s.text, whole.choices[0].text);
    assert.equal(s.finish_reason, 'length');
    assert.equal(s.usage?.completion_tokens, 12);
  });

  test('goldens: gen0 greedy tokens', { skip: !goldensPath && 'MOESHARD_GOLDENS not set' }, async () => {
    const g = readSafetensorsI32(goldensPath, ['gen0.prompt', 'gen0.greedy']);
    const want = g['gen0.greedy'];
    const params = { model, prompt: g['gen0.prompt'], max_tokens: want.length, temperature: 0, ignore_eos: true, return_token_ids: true };
    const r = await client.completions.create(params);
    assert.deepEqual(r.choices[0].token_ids, want);
    assert.deepEqual((await streamCompletion(params)).token_ids, want);
  });

  test('text prompt streamed and not', async (t) => {
    if (!hasTokenizer) return t.skip('the model has no tokenizer');
    const params = { model, prompt: 'Once upon a time', max_tokens: 10, temperature: 0, ignore_eos: true };
    const whole = await client.completions.create(params);
    const s = await streamCompletion(params);
    assert.equal(s.text, whole.choices[0].text);
    assert.ok(whole.choices[0].text.length > 0);
  });
});

describe('openai chat completions', () => {
  const messages = [
    { role: 'system', content: 'You are a helpful assistant.' },
    { role: 'user', content: 'Write a haiku about autumn.' },
  ];

  test('streamed equals non-streamed', async (t) => {
    if (!hasTokenizer) return t.skip('the model has no tokenizer');
    const params = { model, messages, max_tokens: 16, temperature: 0, ignore_eos: true };
    const whole = await client.chat.completions.create(params);
    assert.equal(whole.object, 'chat.completion');
    assert.equal(whole.choices[0].message.role, 'assistant');
    assert.equal(whole.choices[0].finish_reason, 'length');
    assert.equal(whole.usage.completion_tokens, 16);
    const stream = await client.chat.completions.create({ ...params, stream: true });
    let content = '';
    let finish = null;
    for await (const chunk of stream) {
      assert.equal(chunk.object, 'chat.completion.chunk');
      for (const c of chunk.choices) {
        content += c.delta?.content ?? '';
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.equal(content, whole.choices[0].message.content);
    assert.equal(finish, 'length');
  });

  test('logprobs with top_logprobs, sorted', async (t) => {
    if (!hasTokenizer) return t.skip('the model has no tokenizer');
    const r = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 2 });
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, r.usage.completion_tokens);
    for (const e of content) {
      assert.equal(e.top_logprobs.length, 2);
      assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
      assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-3, 'greedy token is not the most likely');
    }
  });
});

describe('openai errors', () => {
  test('bad request -> BadRequestError (400)', async () => {
    await assert.rejects(client.completions.create({ model, prompt: [1, 2], max_tokens: 4, temperature: -1 }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `got ${e}`);
      assert.equal(e.status, 400);
      assert.equal(typeof e.error?.message, 'string');
      return true;
    });
  });

  test('unknown model -> NotFoundError (404)', async () => {
    await assert.rejects(client.completions.create({ model: 'no-such-model', prompt: [1, 2], max_tokens: 4 }), OpenAI.NotFoundError);
  });

  test('wrong API key -> AuthenticationError (401)', { skip: !apiKey && 'MOESHARD_API_KEY not set' }, async () => {
    const wrong = new OpenAI({ baseURL: `${url}/v1`, apiKey: `${apiKey}-wrong`, maxRetries: 0 });
    await assert.rejects(wrong.completions.create({ model, prompt: [1, 2], max_tokens: 2 }), OpenAI.AuthenticationError);
    await assert.rejects(wrong.models.list(), OpenAI.AuthenticationError);
  });
});
