// Loads and runs ONNX files in onnxruntime-node (native CPU) or onnxruntime-web (WASM, in Node),
// then times those that ran, in turns (round robin), one thread.
//
//   node run_forms.js BACKEND DIR FORM... [--budget SECONDS]
//
// BACKEND: node | web. DIR holds FORM.onnx for each FORM and inputs.json (name -> {dtype, dims,
// file}: raw little-endian bytes in DIR). Writes DIR/results.json ({version, forms: {FORM:
// {outputs: [{dtype, dims, file}], median_ms} or {error, stage}}}) and each output's bytes to
// DIR/out.FORM.I.bin. No other dependency than the two pinned packages (package.json).
'use strict';

const fs = require('fs');
const path = require('path');

// float16 travels as its bits (Node 20 has no Float16Array; onnxruntime-js takes Uint16Array)
const ARRAYS = { float32: Float32Array, float16: Uint16Array, int64: BigInt64Array, int32: Int32Array };

function readInputs(ort, dir) {
  const meta = JSON.parse(fs.readFileSync(path.join(dir, 'inputs.json'), 'utf8'));
  const feeds = {};
  for (const [name, { dtype, dims, file }] of Object.entries(meta)) {
    const bytes = fs.readFileSync(path.join(dir, file));
    const copy = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
    feeds[name] = new ort.Tensor(dtype, new ARRAYS[dtype](copy), dims);
  }
  return feeds;
}

function backend(name) {
  if (name === 'node') {
    const ort = require('onnxruntime-node');
    const version = ort.env.versions.node;
    return { ort, version, options: { intraOpNumThreads: 1, interOpNumThreads: 1 } };
  }
  if (name === 'web') {
    const ort = require('onnxruntime-web');
    ort.env.wasm.numThreads = 1; // as the native row: one thread
    ort.env.logLevel = 'error';
    const version = ort.env.versions.web;
    return { ort, version, options: { executionProviders: ['wasm'] } };
  }
  throw new Error(`unknown backend ${name}: node or web`);
}

function lastLine(error) {
  const lines = String(error && error.message ? error.message : error)
    .split('\n')
    .map((l) => l.trim())
    .filter(Boolean);
  const line = lines.length ? lines[lines.length - 1] : 'error';
  return line.length <= 200 ? line : '…' + line.slice(-199);
}

function median(values) {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
}

async function main(argv) {
  let budget = 3.0;
  const at = argv.indexOf('--budget');
  if (at >= 0) {
    budget = Number(argv[at + 1]);
    argv.splice(at, 2);
  }
  const [name, dir, ...forms] = argv;
  const { ort, version, options } = backend(name);
  const feeds = readInputs(ort, dir);
  const results = {};
  const sessions = {};
  for (const form of forms) {
    let session;
    // onnxruntime-node writes the graph it runs (the caller reads which norm ops are left)
    const optimized = name === 'node' ? { optimizedModelFilePath: path.join(dir, `optimized.${form}.onnx`) } : {};
    try {
      session = await ort.InferenceSession.create(path.join(dir, `${form}.onnx`), { ...options, ...optimized });
    } catch (e) {
      results[form] = { error: lastLine(e), stage: 'does not load' };
      continue;
    }
    let outputs;
    try {
      outputs = await session.run(feeds); // the warm-up run; its outputs are checked
    } catch (e) {
      results[form] = { error: lastLine(e), stage: 'fails to run' };
      continue;
    }
    results[form] = {
      outputs: session.outputNames.map((out, i) => {
        const tensor = outputs[out];
        const file = `out.${form}.${i}.bin`;
        fs.writeFileSync(path.join(dir, file), Buffer.from(tensor.data.buffer, tensor.data.byteOffset, tensor.data.byteLength));
        return { name: out, dtype: tensor.type, dims: tensor.dims, file };
      }),
    };
    sessions[form] = session;
  }
  // in turns, so that the machine's drift falls on every form alike; 3 to 50 rounds
  const times = Object.fromEntries(Object.keys(sessions).map((f) => [f, []]));
  const start = process.hrtime.bigint();
  for (let round = 0; round < 50; round++) {
    for (const [form, session] of Object.entries(sessions)) {
      const t0 = process.hrtime.bigint();
      await session.run(feeds);
      times[form].push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    const spent = Number(process.hrtime.bigint() - start) / 1e9;
    if (round >= 2 && spent > budget) break;
  }
  for (const [form, ms] of Object.entries(times)) results[form].median_ms = median(ms);
  fs.writeFileSync(path.join(dir, 'results.json'), JSON.stringify({ version, forms: results }));
}

main(process.argv.slice(2)).catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
