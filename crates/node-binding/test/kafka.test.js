// Against real Kafka (scripts/services up kafka): topics are created with AdminClient.
"use strict";

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { ProsodyClient, AdminClient } = require("..");
const { kafkaServers, unique, recorder, waitFor, sleep } = require("./helpers");

const servers = kafkaServers();
const admin = new AdminClient(servers);
const topic = unique("node-binding");

before(async () => {
  await admin.createTopic(topic, 4, 1);
});

after(async () => {
  await admin.deleteTopic(topic);
});

function options(extra = {}) {
  return {
    bootstrapServers: servers,
    groupId: unique("node-group"),
    subscribedTopics: topic,
    storageBackend: "memory",
    probePort: null,
    telemetryEnabled: false,
    commitIntervalMs: 200,
    pollIntervalMs: 20,
    // The product default (1 s) is tight for the first sends of a fresh producer on a loaded
    // two-core CI machine; these suites are about consuming, not send latency.
    sendTimeoutMs: 10000,
    ...extra,
  };
}

test("AdminClient: creating an existing topic fails permanently; deleting a missing one too", async () => {
  await assert.rejects(admin.createTopic(topic, 4, 1), (error) => error.isPermanent === true && /exists/.test(error.message));
  await assert.rejects(admin.deleteTopic(unique("missing")), (error) => error.isPermanent === true);
});

test("send, receive, excise, per-key order, unsubscribe and subscribe again", async () => {
  const client = await ProsodyClient.create(options());
  // A separate producer: a client skips records stamped with its own source system.
  const sender = await ProsodyClient.create(options({ subscribedTopics: [] }));
  try {
    const handler = recorder();
    await client.subscribe(handler);
    const keys = ["k1", "k2", "k3", "k4", "k5"];
    for (let seq = 0; seq < 10; seq += 1) {
      await Promise.all(keys.map((key) => sender.send(topic, key, { seq })));
    }
    await sender.excise(topic, "k1");
    await waitFor("all events", () => handler.events.length === 51, 60000);
    for (const key of keys) {
      const seqs = handler.events.filter((event) => event.kind === "message" && event.key === key).map((event) => event.payload.seq);
      assert.deepEqual(seqs, [...Array(10).keys()]);
    }
    const k1 = handler.events.filter((event) => event.key === "k1");
    assert.equal(k1.at(-1).kind, "excise", "the excise comes after the key's earlier messages");
    assert.ok((await client.assignedPartitionCount()) === 4);

    await client.unsubscribe();
    const second = recorder();
    await client.subscribe(second);
    await sender.send(topic, "again", { n: 1 });
    await waitFor("the second subscription", () => second.events.some((event) => event.key === "again"), 60000);
    assert.equal(second.events.filter((event) => event.kind === "message" && event.key !== "again").length, 0, "committed records are not redelivered");
  } finally {
    await Promise.all([client.shutdown(), sender.shutdown()]);
  }
});

test("loop prevention: a client does not consume its own source system", async () => {
  const groupId = unique("node-loop");
  const client = await ProsodyClient.create(options({ groupId }));
  const other = await ProsodyClient.create(options({ groupId: unique("node-other"), subscribedTopics: [] }));
  try {
    const handler = recorder();
    await client.subscribe(handler);
    // One key, so both records share a partition: the foreign record comes after our own one,
    // and once it is handled our own record has been either handled or filtered.
    await client.send(topic, "loop", { mine: true });
    await other.send(topic, "loop", { mine: false });
    await waitFor("the foreign message", () => handler.events.some((event) => event.key === "loop"), 60000);
    const seen = handler.events.filter((event) => event.key === "loop").map((event) => event.payload.mine);
    assert.deepEqual(seen, [false], "only the foreign record reaches the handler");
  } finally {
    await Promise.all([client.shutdown(), other.shutdown()]);
  }
});
