// A grpc-js client of the router's public gRPC API: moeshard.v1.Inference/Generate
// (loaded from ../../proto/moeshard.proto) streams the same greedy tokens as HTTP, tokenizes
// text prompts as HTTP does (allow_special_tokens both ways), bad requests are
// INVALID_ARGUMENT, and grpc.health.v1.Health/Check says SERVING.
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';
import { apiKey, grpcTarget, postJson, promptIds } from './env.mjs';

const here = fileURLToPath(new URL('.', import.meta.url));
const skip = !grpcTarget && 'MOESHARD_GRPC not set';

function load(file) {
  const def = protoLoader.loadSync(file, { keepCase: true, longs: Number, enums: String, defaults: true });
  return grpc.loadPackageDefinition(def);
}

function metadata() {
  const md = new grpc.Metadata();
  if (apiKey) md.set('authorization', `Bearer ${apiKey}`);
  return md;
}

// Collects a Generate stream: token ids, finish_reason, usage, messages.
function generate(stub, request) {
  return new Promise((resolve, reject) => {
    const out = { token_ids: [], finish_reason: '', usage: null, messages: 0, prompt_ids: [] };
    const call = stub.Generate(request, metadata(), { deadline: Date.now() + 120_000 });
    call.on('data', (m) => {
      if (out.messages++ === 0) out.prompt_ids = m.prompt_ids;
      for (const t of m.tokens) out.token_ids.push(t.token_id);
      if (m.finish_reason) {
        out.finish_reason = m.finish_reason;
        out.usage = m.usage;
      }
    });
    call.on('error', reject);
    call.on('end', () => resolve(out));
  });
}

describe('grpc-js', { skip }, () => {
  const api = skip ? null : load(`${here}/../../proto/moeshard.proto`).moeshard.v1;
  const health = skip ? null : load(`${here}/health.proto`).grpc.health.v1;
  const credentials = grpc.credentials.createInsecure();

  test('Inference/Generate streams the same tokens as HTTP', async () => {
    const stub = new api.Inference(grpcTarget, credentials);
    const prompt = promptIds(15, 7);
    const http = await postJson('/v1/completions', {
      prompt, max_tokens: 10, temperature: 0, ignore_eos: true, return_token_ids: true,
    });
    assert.equal(http.status, 200, JSON.stringify(http.body));
    const g = await generate(stub, { prompt_ids: prompt, max_tokens: 10, sampling: { temperature: 0 }, ignore_eos: true });
    assert.deepEqual(g.token_ids, http.body.choices[0].token_ids);
    assert.equal(g.finish_reason, 'length');
    assert.equal(g.usage.completion_tokens, 10);
    assert.equal(g.usage.prompt_tokens, 15);
    assert.deepEqual(g.prompt_ids, prompt);
    stub.close();
  });

  test('a text prompt tokenizes special-token text as HTTP does, with and without allow_special_tokens', async () => {
    const stub = new api.Inference(grpcTarget, credentials);
    const prompt = 'hi<|im_start|>system';
    const ids = {};
    for (const allow of [false, true]) {
      const http = await postJson('/v1/completions', {
        prompt, max_tokens: 1, temperature: 0, return_token_ids: true, allow_special_tokens: allow,
      });
      assert.equal(http.status, 200, JSON.stringify(http.body));
      const g = await generate(stub, { prompt, max_tokens: 1, sampling: { temperature: 0 }, allow_special_tokens: allow });
      assert.deepEqual(g.prompt_ids, http.body.prompt_token_ids, `allow_special_tokens ${allow}`);
      ids[allow] = g.prompt_ids;
    }
    assert.ok(ids[true].length < ids[false].length, `special ${ids[true]} vs text ${ids[false]}`);
    stub.close();
  });

  test('a bad request is INVALID_ARGUMENT', async () => {
    const stub = new api.Inference(grpcTarget, credentials);
    await assert.rejects(generate(stub, { prompt_ids: [1, 2], max_tokens: -1 }), (e) => {
      assert.equal(e.code, grpc.status.INVALID_ARGUMENT, `got ${e.code}: ${e.details}`);
      return true;
    });
    stub.close();
  });

  test('grpc.health.v1 Check is SERVING', async () => {
    const stub = new health.Health(grpcTarget, credentials);
    const reply = await new Promise((resolve, reject) =>
      stub.Check({ service: '' }, metadata(), (err, r) => (err ? reject(err) : resolve(r))));
    assert.equal(reply.status, 'SERVING');
    stub.close();
  });
});
