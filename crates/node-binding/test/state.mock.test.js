// Keyed state through the JavaScript API in mock mode (in-process Kafka, in-memory state).
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { ProsodyClient, value, map, deque, messageValue } = require("..");
const { mockOptions } = require("./helpers");
const scenarios = require("./state-scenarios");

const mock = {
  async start({ collections, handler }) {
    const client = await ProsodyClient.create(mockOptions({ stateCollections: collections }));
    try {
      await client.subscribe(handler);
    } catch (error) {
      await client.shutdown();
      throw error;
    }
    return {
      send: (key, payload) => client.send("events", key, payload),
      excise: (key) => client.excise("events", key),
      shutdown: () => client.shutdown(),
    };
  },
};

test("the README counter: one counter per key, cleared by an excise", () => scenarios.counter(mock));
test("commit() is a floor for a failing attempt's retry", () => scenarios.commitFloor(mock));
test("rollback() drops pending writes back to the last commit", () => scenarios.rollback(mock));
test("readUncommitted writes through: the retry sees them", () => scenarios.readUncommitted(mock));
test("a handle kept past its attempt rejects with a transient state error", () => scenarios.leakedHandle(mock));
test("map scans: key order both ways, chunked, pending writes merged, early break", () => scenarios.mapScans(mock));
test("deque: capacity evicts the oldest, every operation", () => scenarios.dequeCapacity(mock));
test("message collections store a reference and reload the record", () => scenarios.messageCollections(mock));
test("state errors escaping a handler: permanent not retried, transient retried", () => scenarios.errorClassification(mock));
test("state error classes and isStateError", () => scenarios.errorClasses(mock));

test("definitions are frozen data with the seed's fields", () => {
  const definition = map("m", { keysetLimit: 10, ttlSeconds: 60, readUncommitted: true });
  assert.deepEqual({ ...definition }, { name: "m", kind: "map", payload: "json", keysetLimit: 10, ttlSeconds: 60, readUncommitted: true });
  assert.ok(Object.isFrozen(definition));
  assert.deepEqual({ ...messageValue("v") }, { name: "v", kind: "value", payload: "message" });
  assert.throws(() => value(""), TypeError);
});

test("stateCollections are validated by the client, naming the field", async () => {
  const rejects = (collections, pattern) =>
    assert.rejects(ProsodyClient.create(mockOptions({ stateCollections: collections })), (error) => {
      assert.match(error.message, pattern);
      return true;
    });
  await rejects([value("v", { ttlSeconds: 0 })], /stateCollections\[v\]\.ttlSeconds/);
  await rejects([deque("d", { capacity: 0 })], /stateCollections\[d\]\.capacity/);
  await rejects([map("m", { keysetLimit: 5000 })], /stateCollections\[m\]\.keysetLimit/);
  await rejects([value("same"), map("same")], /stateCollections\[same\]/);
  await rejects([{ name: "x", kind: "value", payload: "json", bogus: 1 }], /stateCollections\[0\].*bogus/);
  await rejects("not a list", /stateCollections/);
});
