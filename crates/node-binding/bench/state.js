// Keyed-state operation cost through the Node.js API, in mock mode (no services needed).
//
//   cd crates/node-binding && npm run build:debug   # or a release addon for real numbers
//   node bench/state.js [operations] [keys]
//
// Handlers of `keys` keys run at once (one event each); each runs `operations` sequential
// awaits of one operation kind. Reported per kind: wall time per operation (all keys together,
// i.e. the inverse of throughput) and the latency of one awaited operation within a handler.
// Baselines in the same run: `await Promise.resolve()` (the promise machinery alone) and
// `context.scheduled()` (a context operation through the attempt's request channel), side by
// side with the keyed-state operations, which call their Rust handle directly.
"use strict";

const { randomUUID } = require("node:crypto");
const { ProsodyClient, value, map, deque, setLogger } = require("..");

const OPERATIONS = Number(process.argv[2] ?? 20_000);
const KEYS = Number(process.argv[3] ?? 16);

const V = value("v");
const M = map("m", { keysetLimit: 0 });
const D = deque("d", { capacity: 1000 });

const KINDS = {
  "await Promise.resolve()": async () => {
    for (let i = 0; i < OPERATIONS; i += 1) await Promise.resolve();
  },
  "context.scheduled()": async (context) => {
    for (let i = 0; i < OPERATIONS; i += 1) await context.scheduled();
  },
  "value.get()": async (context) => {
    const v = context.state(V);
    await v.set({ n: 0 });
    for (let i = 0; i < OPERATIONS; i += 1) await v.get();
  },
  "value.set({n})": async (context) => {
    const v = context.state(V);
    for (let i = 0; i < OPERATIONS; i += 1) await v.set({ n: i });
  },
  "map.set(key, n)": async (context) => {
    const m = context.state(M);
    for (let i = 0; i < OPERATIONS; i += 1) await m.set(`e${i % 1000}`, i);
  },
  "map.entries() per entry": async (context) => {
    const m = context.state(M);
    for (let i = 0; i < 1000; i += 1) await m.set(`e${String(i).padStart(4, "0")}`, i);
    const rounds = Math.max(1, Math.floor(OPERATIONS / 1000));
    for (let r = 0; r < rounds; r += 1) {
      // eslint-disable-next-line no-unused-vars
      for await (const _ of m.entries()) {
        // consume
      }
    }
  },
  "deque.push(n)": async (context) => {
    const d = context.state(D);
    for (let i = 0; i < OPERATIONS; i += 1) await d.push(i);
  },
};

async function main() {
  if (!process.env.BENCH_VERBOSE) setLogger({ error: console.error, warn() {}, info() {}, debug() {}, trace() {} });
  const client = await ProsodyClient.create({
    mock: true,
    groupId: `bench-${randomUUID().slice(0, 8)}`,
    // Not the group id (the default): records stamped with the group's own id are skipped.
    sourceSystem: `bench-source-${randomUUID().slice(0, 8)}`,
    subscribedTopics: "events",
    probePort: null,
    maxConcurrency: KEYS * 2,
    timeoutMs: "10m",
    pollIntervalMs: 20,
    commitIntervalMs: 100,
    stateCollections: [V, M, D],
  });
  const runs = new Map();
  await client.subscribe({
    async onMessage(context, message) {
      const run = runs.get(message.payload.kind);
      const started = process.hrtime.bigint();
      await KINDS[message.payload.kind](context);
      const elapsed = process.hrtime.bigint() - started;
      run.latencies.push(Number(elapsed));
      if (run.latencies.length === KEYS) run.done(process.hrtime.bigint());
      return null;
    },
    async onExcise() {},
    async onTimer() {},
  });
  console.log(`${OPERATIONS} sequential operations per handler, ${KEYS} keys at once, mock mode`);
  for (const kind of Object.keys(KINDS)) {
    let done;
    const finished = new Promise((resolve) => (done = resolve));
    const run = { latencies: [], done };
    runs.set(kind, run);
    const started = process.hrtime.bigint();
    await Promise.all(Array.from({ length: KEYS }, (_, k) => client.send("events", `${kind}-${k}`, { kind })));
    const ended = await finished;
    const operations = kind.endsWith("per entry") ? Math.max(1, Math.floor(OPERATIONS / 1000)) * 1000 : OPERATIONS;
    const wallPerOp = Number(ended - started) / (operations * KEYS);
    const latency = run.latencies.reduce((a, b) => a + b, 0) / run.latencies.length / operations;
    console.log(`${kind.padEnd(26)} ${wallPerOp.toFixed(0).padStart(7)} ns/op (all keys)  ${latency.toFixed(0).padStart(7)} ns awaited in a handler`);
  }
  await client.shutdown();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
