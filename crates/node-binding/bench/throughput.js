// Throughput: N records through ProsodyClient.subscribe with a trivial async handler, and the
// same N records through KafkaJS eachMessage with a trivial handler, on the same topic in the
// same run (each with its own consumer group, both reading from the beginning).
//
//   cd crates/node-binding && npm run build && (cd bench && npm install)
//   PROSODY_BOOTSTRAP_SERVERS=127.0.0.1:9092 node bench/throughput.js [records]
"use strict";

const { randomUUID } = require("node:crypto");
const { Kafka, logLevel } = require("kafkajs");
const { ProsodyClient, AdminClient, setLogger } = require("..");

const RECORDS = Number(process.argv[2] ?? 100_000);
const PARTITIONS = 4;
const KEYS = 1000;
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
    maxConcurrency: 256,
    maxUncommitted: 4096,
  });
  let count = 0;
  let started;
  let resolveDone;
  const done = new Promise((resolve) => (resolveDone = resolve));
  await client.subscribe({
    async onMessage() {
      if (count === 0) started = process.hrtime.bigint();
      count += 1;
      if (count === RECORDS) resolveDone(process.hrtime.bigint());
      return null;
    },
    async onExcise() {
      return null;
    },
    async onTimer() {},
  });
  const elu = require("node:perf_hooks").performance.eventLoopUtilization();
  const ended = await done;
  const used = require("node:perf_hooks").performance.eventLoopUtilization(elu);
  if (process.env.BENCH_VERBOSE) console.log(`prosody event-loop utilization: ${(used.utilization * 100).toFixed(0)}%`);
  await client.shutdown();
  return rate(started, ended);
}

async function benchKafkaJs() {
  const consumer = kafka.consumer({ groupId: `bench-kafkajs-${randomUUID().slice(0, 8)}` });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let count = 0;
  let started;
  let resolveDone;
  const done = new Promise((resolve) => (resolveDone = resolve));
  await consumer.run({
    partitionsConsumedConcurrently: PARTITIONS,
    eachMessage: async ({ message }) => {
      if (count === 0) started = process.hrtime.bigint();
      JSON.parse(message.value.toString());
      count += 1;
      if (count === RECORDS) resolveDone(process.hrtime.bigint());
    },
  });
  const ended = await done;
  await consumer.disconnect();
  return rate(started, ended);
}

function rate(started, ended) {
  const seconds = Number(ended - started) / 1e9;
  return { seconds, perSecond: RECORDS / seconds };
}

async function main() {
  const admin = new AdminClient(servers);
  await admin.createTopic(topic, PARTITIONS, 1);
  try {
    await produce();
    console.log(`${RECORDS} records, ${PARTITIONS} partitions, ${KEYS} keys, topic ${topic}`);
    const prosody = await benchProsody();
    console.log(`prosody subscribe:  ${prosody.perSecond.toFixed(0)} records/s (${prosody.seconds.toFixed(2)} s)`);
    const kafkajs = await benchKafkaJs();
    console.log(`kafkajs eachMessage: ${kafkajs.perSecond.toFixed(0)} records/s (${kafkajs.seconds.toFixed(2)} s)`);
    console.log(`ratio prosody/kafkajs: ${(prosody.perSecond / kafkajs.perSecond).toFixed(2)}x`);
  } finally {
    await admin.deleteTopic(topic);
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
