// Throughput: N records through ProsodyClient.subscribe with a trivial async handler, and the
// same N records through KafkaJS eachMessage with a trivial handler, on the same topic in the
// same run (each with its own consumer group, both reading from the beginning).
//
//   cd crates/node-binding && npm run build && (cd bench && npm ci)
//   PROSODY_BOOTSTRAP_SERVERS=127.0.0.1:9092 node bench/throughput.js [records]
//
// Both sides are timed the same way: from the first handler call to the call that counts the
// last record (process.hrtime), so consumer start-up and group join are excluded on both. Each
// side also reports the process CPU time (all threads) and event-loop utilization over that
// window. BENCH_ORDER=kafkajs runs KafkaJS first (default: prosody first);
// BENCH_ONLY=prosody skips KafkaJS (for profiling); BENCH_MAX_CONCURRENCY overrides Prosody's maxConcurrency (default 256)
// and BENCH_MAX_UNCOMMITTED its maxUncommitted (default: maxConcurrency, the least it may be; a deeper
// backlog is slower here, see the README).
// BENCH_ROUNDS (default 3) consumes the topic that many times per side, alternating the sides,
// each pass with a fresh consumer group; the summary compares the medians, since a single pass
// of 100,000 records lasts about a second and moves by 20% with the machine's other load.
"use strict";

const { randomUUID } = require("node:crypto");
const { Kafka, logLevel } = require("kafkajs");
const { performance } = require("node:perf_hooks");
const { ProsodyClient, AdminClient, setLogger } = require("..");

const RECORDS = Number(process.argv[2] ?? 100_000);
const PARTITIONS = 4;
const KEYS = 1000;
const MAX_CONCURRENCY = Number(process.env.BENCH_MAX_CONCURRENCY ?? 256);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
if (!Number.isInteger(ROUNDS) || ROUNDS < 1) {
  console.error(`BENCH_ROUNDS must be a whole number >= 1, got ${process.env.BENCH_ROUNDS}`);
  process.exit(2);
}

// BENCH_VERBOSE=1: count the completion reports index.js makes (one per batch of handlers that
// settled in the same event-loop turn), to see how many events each round trip carries.
const completions = { calls: 0, events: 0 };
if (process.env.BENCH_VERBOSE) {
  const native = require("../native");
  const completeEvents = native.completeEvents;
  native.completeEvents = (ok, others) => {
    completions.calls += 1;
    completions.events += ok.length + (others ? JSON.parse(others).length : 0);
    return completeEvents(ok, others);
  };
}
const servers = process.env.PROSODY_BOOTSTRAP_SERVERS;
if (!servers) {
  console.error("PROSODY_BOOTSTRAP_SERVERS is not set: run `scripts/services up kafka` first");
  process.exit(2);
}
const quiet = (message) => {
  if (/error|warn/i.test(message)) process.stderr.write(`${message}\n`);
};
setLogger({ error: quiet, warn: quiet, info() {}, debug() {}, trace() {} });

const topic = `bench-${randomUUID().slice(0, 8)}`;
const kafka = new Kafka({ clientId: "bench", brokers: servers.split(","), logLevel: logLevel.NOTHING });

async function produce() {
  const producer = kafka.producer();
  await producer.connect();
  const batch = 5000;
  for (let start = 0; start < RECORDS; start += batch) {
    const messages = [];
    for (let i = start; i < Math.min(start + batch, RECORDS); i += 1) {
      messages.push({ key: `key-${i % KEYS}`, value: JSON.stringify({ seq: i, type: "bench.event", body: "x".repeat(64) }) });
    }
    await producer.send({ topic, messages });
  }
  await producer.disconnect();
}

async function benchProsody() {
  const client = await ProsodyClient.create({
    bootstrapServers: servers,
    groupId: `bench-prosody-${randomUUID().slice(0, 8)}`,
    subscribedTopics: topic,
    storageBackend: "memory",
    probePort: null,
    maxConcurrency: MAX_CONCURRENCY,
    maxUncommitted: Number(process.env.BENCH_MAX_UNCOMMITTED ?? MAX_CONCURRENCY),
  });
  const meter = new Meter();
  await client.subscribe({
    async onMessage() {
      meter.tick();
      return null;
    },
    async onExcise() {
      return null;
    },
    async onTimer() {},
  });
  const before = { ...completions };
  const result = await meter.done;
  if (process.env.BENCH_VERBOSE) {
    const calls = completions.calls - before.calls;
    const events = completions.events - before.events;
    console.log(`prosody completion reports: ${calls}, ${(events / calls).toFixed(1)} events each`);
  }
  await client.shutdown();
  return result;
}

async function benchKafkaJs() {
  const consumer = kafka.consumer({ groupId: `bench-kafkajs-${randomUUID().slice(0, 8)}` });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const meter = new Meter();
  await consumer.run({
    partitionsConsumedConcurrently: PARTITIONS,
    eachMessage: async ({ message }) => {
      meter.tick();
      // Prosody hands handlers the payload already parsed; KafkaJS hands bytes.
      JSON.parse(message.value.toString());
    },
  });
  const result = await meter.done;
  await consumer.disconnect();
  return result;
}

/** Counts handler calls; resolves with rate, CPU and event-loop use once RECORDS were seen. */
class Meter {
  constructor() {
    this.count = 0;
    this.done = new Promise((resolve) => (this.resolve = resolve));
  }

  tick() {
    if (this.count === 0) {
      this.started = process.hrtime.bigint();
      this.cpu = process.cpuUsage();
      this.elu = performance.eventLoopUtilization();
    }
    this.count += 1;
    if (this.count === RECORDS) {
      const seconds = Number(process.hrtime.bigint() - this.started) / 1e9;
      const cpu = process.cpuUsage(this.cpu);
      const elu = performance.eventLoopUtilization(this.elu);
      this.resolve({
        seconds,
        perSecond: RECORDS / seconds,
        cpuSeconds: (cpu.user + cpu.system) / 1e6,
        loop: elu.utilization,
      });
    }
  }
}

function describe(name, result) {
  return (
    `${name} ${result.perSecond.toFixed(0)} records/s (${result.seconds.toFixed(2)} s, ` +
    `CPU ${result.cpuSeconds.toFixed(2)} s = ${((result.cpuSeconds / result.seconds) * 100).toFixed(0)}% of a core, ` +
    `${((result.cpuSeconds / RECORDS) * 1e6).toFixed(1)} us/record, event loop ${(result.loop * 100).toFixed(0)}% busy)`
  );
}

/** The pass with the median rate of `results` (the lower middle one for an even count). */
function median(results) {
  const sorted = [...results].sort((a, b) => a.perSecond - b.perSecond);
  return sorted[Math.floor((sorted.length - 1) / 2)];
}

async function main() {
  const admin = new AdminClient(servers);
  await admin.createTopic(topic, PARTITIONS, 1);
  try {
    await produce();
    console.log(
      `${RECORDS} records, ${PARTITIONS} partitions, ${KEYS} keys, maxConcurrency ${MAX_CONCURRENCY}, ` +
        `${ROUNDS} round(s), topic ${topic}`,
    );
    const sides = [["prosody subscribe:  ", benchProsody, []]];
    if (process.env.BENCH_ONLY !== "prosody") {
      sides.push(["kafkajs eachMessage:", benchKafkaJs, []]);
      if (process.env.BENCH_ORDER === "kafkajs") sides.reverse();
    }
    for (let round = 1; round <= ROUNDS; round += 1) {
      for (const [name, bench, results] of sides) {
        const result = await bench();
        results.push(result);
        console.log(`round ${round} ${describe(name, result)}`);
      }
    }
    const medians = new Map(sides.map(([name, , results]) => [name.trim(), median(results)]));
    for (const [name, result] of medians) console.log(describe(`median ${name}`, result));
    if (medians.size === 2) {
      const prosody = medians.get("prosody subscribe:");
      const kafkajs = medians.get("kafkajs eachMessage:");
      console.log(`ratio prosody/kafkajs (medians): ${(prosody.perSecond / kafkajs.perSecond).toFixed(2)}x`);
    }
  } finally {
    await admin.deleteTopic(topic);
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
