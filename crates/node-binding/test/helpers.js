"use strict";

const { randomUUID } = require("node:crypto");

/** The address of a real service from `variable`; fails the test with instructions when unset. */
function serviceAddress(variable, service, example) {
  const address = process.env[variable];
  if (!address) {
    throw new Error(
      `${variable} is not set: run \`scripts/services up ${service}\` and ` +
        `\`export ${variable}=${example}\` (scripts/test does both)`,
    );
  }
  return address;
}

/** The real Kafka bootstrap servers. */
function kafkaServers() {
  return serviceAddress("PROSODY_BOOTSTRAP_SERVERS", "kafka", "127.0.0.1:9092");
}

/** The real Cassandra contact points. */
function cassandraNodes() {
  return serviceAddress("PROSODY_CASSANDRA_NODES", "cassandra", "127.0.0.1:9042");
}

function unique(prefix) {
  return `${prefix}-${randomUUID().slice(0, 8)}`;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `predicate` until it is truthy or `timeoutMs` passes (then throws with `what`). */
async function waitFor(what, predicate, timeoutMs = 15000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await predicate();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await sleep(20);
  }
}

/** A handler that records events; `overrides` replaces single methods. */
function recorder(overrides = {}) {
  const events = [];
  const handler = {
    events,
    async onMessage(context, message) {
      events.push({ kind: "message", key: message.key, payload: message.payload, message });
      return null;
    },
    async onExcise(context, message) {
      events.push({ kind: "excise", key: message.key, message });
      return null;
    },
    async onTimer(context, timer) {
      events.push({ kind: "timer", key: timer.key, timer });
    },
    ...overrides,
  };
  return handler;
}

/** Mock-mode options: in-process Kafka, no probe server, fast commits. */
function mockOptions(extra = {}) {
  return {
    mock: true,
    groupId: unique("group"),
    sourceSystem: unique("source"),
    subscribedTopics: "events",
    probePort: null,
    commitIntervalMs: 100,
    pollIntervalMs: 20,
    retryBaseMs: 10,
    maxRetryDelayMs: 50,
    sendTimeoutMs: 10000,
    ...extra,
  };
}

module.exports = { kafkaServers, cassandraNodes, unique, sleep, waitFor, recorder, mockOptions };
