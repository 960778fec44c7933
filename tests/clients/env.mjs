// What the client tests run against, from the environment:
//   MOESHARD_URL      the router, http://HOST:PORT (required)
//   MOESHARD_GRPC     its gRPC API, HOST:PORT (the gRPC tests skip without it)
//   MOESHARD_API_KEY  the router's API key, if it has one
//   MOESHARD_GOLDENS  a goldens.safetensors whose gen0 prompt/greedy the answers must match
import { readFileSync } from 'node:fs';

export const url = (process.env.MOESHARD_URL ?? '').replace(/\/+$/, '');
export const grpcTarget = process.env.MOESHARD_GRPC ?? '';
export const apiKey = process.env.MOESHARD_API_KEY ?? '';
export const goldensPath = process.env.MOESHARD_GOLDENS ?? '';

if (!url) throw new Error('set MOESHARD_URL to the router (http://HOST:PORT)');

// Deterministic token-id prompts (ids below 256 exist in every vocabulary).
export function promptIds(len, seed) {
  const ids = [];
  let x = seed * 2654435761 + 12345;
  for (let i = 0; i < len; i++) {
    x = (x * 1103515245 + 12345) % 2147483648;
    ids.push(x % 256);
  }
  return ids;
}

// Reads int32 tensors from a safetensors file: 8-byte header length, JSON header, data.
export function readSafetensorsI32(path, names) {
  const buf = readFileSync(path);
  const headerLen = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8'));
  const out = {};
  for (const name of names) {
    const t = header[name];
    if (!t || t.dtype !== 'I32') throw new Error(`${path}: no int32 tensor ${name}`);
    const [begin, end] = t.data_offsets;
    const bytes = buf.subarray(8 + headerLen + begin, 8 + headerLen + end);
    out[name] = Array.from({ length: bytes.length / 4 }, (_, i) => bytes.readInt32LE(4 * i));
  }
  return out;
}

// POST JSON to the router with the key, as a plain HTTP client would.
export async function postJson(path, body) {
  const headers = { 'Content-Type': 'application/json' };
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  const res = await fetch(url + path, { method: 'POST', headers, body: JSON.stringify(body) });
  return { status: res.status, body: await res.json() };
}
