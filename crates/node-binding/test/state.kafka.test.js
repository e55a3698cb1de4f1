// Keyed state against real Kafka (topics created with AdminClient) with the state in
// Cassandra (PROSODY_CASSANDRA_NODES), the production setup: message collections reload their
// records from the real topic.
"use strict";

const { test, after } = require("node:test");
const assert = require("node:assert/strict");
const { ProsodyClient, AdminClient, PermanentStateError, value, map } = require("..");
const { kafkaServers, cassandraNodes, unique } = require("./helpers");
const scenarios = require("./state-scenarios");

const servers = kafkaServers();
const admin = new AdminClient(servers);
const topics = [];

const nodes = cassandraNodes();

after(async () => {
  await Promise.all(topics.map((topic) => admin.deleteTopic(topic)));
});

async function newTopic() {
  const topic = unique("node-state");
  await admin.createTopic(topic, 2, 1);
  topics.push(topic);
  return topic;
}

function options(topic, extra = {}) {
  return {
    bootstrapServers: servers,
    groupId: unique("node-state-group"),
    subscribedTopics: topic,
    storageBackend: "cassandra",
    cassandraNodes: nodes,
    cassandraKeyspace: "prosody_node_tests",
    probePort: null,
    telemetryEnabled: false,
    commitIntervalMs: 200,
    pollIntervalMs: 20,
    retryBaseMs: 10,
    maxRetryDelayMs: 50,
    // The product default (1 s) is tight for the first sends of a fresh producer on a loaded
    // two-core CI machine; these suites are about consuming, not send latency.
    sendTimeoutMs: 10000,
    ...extra,
  };
}

const kafka = {
  async start({ collections, handler }) {
    const topic = await newTopic();
    const client = await ProsodyClient.create(options(topic, { stateCollections: collections }));
    // A separate producer: a client skips records stamped with its own source system.
    const sender = await ProsodyClient.create(options(topic, { subscribedTopics: [], storageBackend: "memory" }));
    try {
      await client.subscribe(handler);
    } catch (error) {
      await Promise.all([client.shutdown(), sender.shutdown()]);
      throw error;
    }
    return {
      send: (key, payload) => sender.send(topic, key, payload),
      excise: (key) => sender.excise(topic, key),
      shutdown: () => Promise.all([client.shutdown(), sender.shutdown()]),
    };
  },
};

test("the README counter: one counter per key, cleared by an excise", () => scenarios.counter(kafka));
test("commit() is a floor for a failing attempt's retry", () => scenarios.commitFloor(kafka));
test("rollback() drops pending writes back to the last commit", () => scenarios.rollback(kafka));
test("readUncommitted writes through: the retry sees them", () => scenarios.readUncommitted(kafka));
test("a handle kept past its attempt rejects with a transient state error", () => scenarios.leakedHandle(kafka));
test("map scans: key order both ways, chunked, pending writes merged, early break", () => scenarios.mapScans(kafka));
test("deque: capacity evicts the oldest, every operation", () => scenarios.dequeCapacity(kafka));
test("message collections store a reference and reload the record from Kafka", () => scenarios.messageCollections(kafka));
test("state errors escaping a handler: permanent not retried, transient retried", () => scenarios.errorClassification(kafka));

test("a durable name re-registered with another kind fails subscribe with a PermanentStateError", async () => {
  const topic = await newTopic();
  const groupId = unique("node-state-identity");
  const handler = { onMessage: async () => null, onExcise: async () => null, onTimer: async () => {} };
  const first = await ProsodyClient.create(options(topic, { groupId, stateCollections: [value("shared-name")] }));
  try {
    await first.subscribe(handler);
  } finally {
    await first.shutdown();
  }
  const second = await ProsodyClient.create(options(topic, { groupId, stateCollections: [map("shared-name")] }));
  try {
    await assert.rejects(second.subscribe(handler), (error) => {
      assert.ok(error instanceof PermanentStateError, `${error}`);
      assert.equal(error.isPermanent, true);
      assert.match(error.message, /shared-name/);
      return true;
    });
  } finally {
    await second.shutdown();
  }
  // The same kind again is fine.
  const third = await ProsodyClient.create(options(topic, { groupId, stateCollections: [value("shared-name")] }));
  try {
    await third.subscribe(handler);
  } finally {
    await third.shutdown();
  }
});
