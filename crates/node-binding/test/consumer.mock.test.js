// Consumer behaviour through the JavaScript API, in mock mode (in-process Kafka).
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const { ProsodyClient, TransientError, PermanentError, permanent } = require("..");
const { mockOptions, recorder, waitFor, sleep } = require("./helpers");

async function withClient(extra, body) {
  const client = await ProsodyClient.create(mockOptions(extra));
  try {
    return await body(client);
  } finally {
    await client.shutdown();
  }
}

test("send and receive: message fields, payload and state", () =>
  withClient({}, async (client) => {
    assert.equal(await client.consumerState(), "configured");
    const handler = recorder();
    await client.subscribe(handler);
    assert.equal(await client.consumerState(), "running");
    await client.send("events", "k1", { content: "hello", n: [1, 2] });
    await waitFor("the message", () => handler.events.length === 1);
    const { message } = handler.events[0];
    assert.equal(message.topic, "events");
    assert.equal(message.key, "k1");
    assert.deepEqual(message.payload, { content: "hello", n: [1, 2] });
    assert.equal(typeof message.partition, "number");
    assert.equal(typeof message.offset, "number");
    assert.ok(message.timestamp instanceof Date && Math.abs(message.timestamp - Date.now()) < 60000);
    assert.ok((await client.assignedPartitionCount()) > 0);
    assert.equal(await client.isStalled(), false);
  }));

test("excise reaches onExcise without a payload", () =>
  withClient({}, async (client) => {
    const handler = recorder();
    await client.subscribe(handler);
    await client.excise("events", "gone");
    await waitFor("the excise", () => handler.events.length === 1);
    assert.equal(handler.events[0].kind, "excise");
    assert.equal(handler.events[0].key, "gone");
    assert.equal("payload" in handler.events[0].message, false);
  }));

test("one key at a time, in order; different keys concurrently", () =>
  withClient({ maxConcurrency: 16, maxUncommitted: 64 }, async (client) => {
    const keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
    const perKey = 15;
    const seen = new Map(keys.map((key) => [key, []]));
    const running = new Map();
    let inFlight = 0;
    let maxInFlight = 0;
    let overlaps = 0;
    const handler = recorder({
      async onMessage(context, message) {
        if (running.get(message.key)) overlaps += 1;
        running.set(message.key, true);
        inFlight += 1;
        maxInFlight = Math.max(maxInFlight, inFlight);
        await sleep(5 + Math.random() * 10);
        seen.get(message.key).push(message.payload.seq);
        inFlight -= 1;
        running.set(message.key, false);
      },
    });
    await client.subscribe(handler);
    for (let seq = 0; seq < perKey; seq += 1) {
      await Promise.all(keys.map((key) => client.send("events", key, { seq })));
    }
    await waitFor("every message", () => [...seen.values()].every((list) => list.length === perKey), 30000);
    for (const [key, list] of seen) {
      assert.deepEqual(list, [...Array(perKey).keys()], `key ${key} in order`);
    }
    assert.equal(overlaps, 0, "a key never runs two handlers at once");
    assert.ok(maxInFlight > 1, `different keys ran concurrently (max ${maxInFlight})`);
  }));

test("transient failures are retried; permanent ones are not", () =>
  withClient({}, async (client) => {
    const attempts = new Map();
    const handler = recorder({
      async onMessage(context, message) {
        const count = (attempts.get(message.key) ?? 0) + 1;
        attempts.set(message.key, count);
        if (message.key === "flaky" && count < 3) throw new TransientError("not yet");
        if (message.key === "plain" && count < 2) throw new Error("unclassified errors are transient");
        if (message.key === "bad") throw new PermanentError("never");
        if (message.key === "typed") throw new TypeError("classified permanent by decorator");
        return null;
      },
    });
    handler.onMessage = permanent(TypeError)(handler.onMessage);
    await client.subscribe(handler);
    for (const key of ["flaky", "plain", "bad", "typed"]) await client.send("events", key, { key });
    await waitFor("retries", () => attempts.get("flaky") === 3 && attempts.get("plain") === 2);
    await waitFor("permanent attempts", () => attempts.get("bad") === 1 && attempts.get("typed") === 1);
    await sleep(300);
    assert.equal(attempts.get("bad"), 1, "a permanent failure is not retried");
    assert.equal(attempts.get("typed"), 1, "a decorated permanent type is not retried");
    assert.equal(attempts.get("flaky"), 3);
    // The key moves on after a permanent failure.
    await client.send("events", "bad", { again: true });
    await waitFor("the next message of the key", () => attempts.get("bad") === 2);
  }));

test("a handler returning undefined, a value, or throwing synchronously", () =>
  withClient({}, async (client) => {
    const attempts = new Map();
    const handler = recorder({
      onMessage(context, message) {
        const count = (attempts.get(message.key) ?? 0) + 1;
        attempts.set(message.key, count);
        if (message.key === "sync-throw" && count === 1) throw new Error("synchronous");
        if (message.key === "value") return { answer: 42 };
        return undefined;
      },
    });
    await client.subscribe(handler);
    for (const key of ["sync-throw", "value", "undefined"]) await client.send("events", key, {});
    await waitFor("all handled", () => attempts.get("sync-throw") === 2 && attempts.get("value") === 1 && attempts.get("undefined") === 1);
  }));

test("the AbortSignal aborts, shouldCancel flips and onCancel resolves on cancellation", () =>
  withClient({ shutdownTimeoutMs: 1000 }, async (client) => {
    const observed = {};
    let started;
    const startedPromise = new Promise((resolve) => (started = resolve));
    const handler = recorder({
      async onMessage(context, message, signal) {
        observed.before = { aborted: signal.aborted, shouldCancel: context.shouldCancel };
        started();
        await context.onCancel();
        observed.after = { aborted: signal.aborted, shouldCancel: context.shouldCancel };
        return null;
      },
    });
    await client.subscribe(handler);
    await client.send("events", "slow", {});
    await startedPromise;
    const began = Date.now();
    await client.unsubscribe();
    assert.ok(Date.now() - began < 5000);
    assert.deepEqual(observed.before, { aborted: false, shouldCancel: false });
    assert.deepEqual(observed.after, { aborted: true, shouldCancel: true });
    assert.equal(await client.consumerState(), "configured");
  }));

test("every handler that can reach its third argument gets an AbortSignal", async () => {
  // index.js skips building the signal only for handlers that cannot receive it; each of
  // these can, in a way the function's `length` does not show (or through a decorator).
  const seen = new Map();
  const record = (way, signal) => {
    seen.set(way, signal instanceof AbortSignal && !signal.aborted);
    return null;
  };
  const ways = {
    named: async (context, message, signal) => record("named", signal),
    rest: async (...args) => record("rest", args[2]),
    defaulted: async (context, message = {}, signal) => record("defaulted", signal),
    destructured: async (context, { key } = {}, signal) => record("destructured", signal),
    arguments: function (context, message) {
      record("arguments", arguments[2]);
      return Promise.resolve(null);
    },
    decorated: permanent(TypeError)(async (context, message, signal) => record("decorated", signal)),
  };
  // One client per way, side by side: each way must be the handler's own onMessage.
  await Promise.all(
    Object.entries(ways).map(([name, way]) =>
      withClient({}, async (client) => {
        await client.subscribe(recorder({ onMessage: way }));
        await client.send("events", name, {});
        await waitFor(`the ${name} handler`, () => seen.has(name), 60000);
      }),
    ),
  );
  for (const name of Object.keys(ways)) assert.equal(seen.get(name), true, name);
});

test("timeoutMs aborts the handler's signal", async () => {
  await withClient({ timeoutMs: 300, stallThresholdMs: 60000 }, async (client) => {
    let outcome;
    let settled;
    const handler = recorder({
      async onMessage(context, message, signal) {
        if (outcome) return null;
        outcome = await Promise.race([
          new Promise((resolve) => signal.addEventListener("abort", () => resolve("aborted"))),
          sleep(3000).then(() => "not aborted"),
        ]);
        settled = Date.now();
        return null;
      },
    });
    await client.subscribe(handler);
    const sent = Date.now();
    await client.send("events", "slow", {});
    await waitFor("the handler outcome", () => outcome, 10000);
    assert.equal(outcome, "aborted");
    // Not before the deadline. Counted from the send: the attempt, and its deadline, cannot
    // start before the record exists, while this function may start well after the attempt
    // when the event loop is busy (CI saw 220 ms). 10 ms for the two clocks' granularity.
    assert.ok(settled - sent >= 290, `aborted ${settled - sent} ms after the send`);
  });
});

test("timers: schedule, scheduled, unschedule, clearAndSchedule, clearScheduled", async () => {
  await withClient({}, async (client) => {
    const fired = [];
    const results = {};
    const handler = recorder({
      async onMessage(context, message) {
        try {
          const base = Math.ceil(Date.now() / 1000) * 1000;
          const later = new Date(base + 3_600_000);
          await context.schedule(new Date(base + 1000));
          await context.schedule(later);
          await context.schedule(later); // upsert: still one timer at that second
          results.afterSchedule = (await context.scheduled()).map(Number);
          await context.unschedule(later);
          results.afterUnschedule = (await context.scheduled()).map(Number);
          await context.clearAndSchedule(later);
          results.afterClearAndSchedule = (await context.scheduled()).map(Number);
          await context.clearScheduled();
          results.afterClear = (await context.scheduled()).map(Number);
          await context.schedule(new Date(base + 1000));
          results.expected = { soon: base + 1000, later: later.getTime() };
        } catch (error) {
          results.error = error;
        }
        return null;
      },
      async onTimer(context, timer) {
        fired.push(timer);
      },
    });
    await client.subscribe(handler);
    await client.send("events", "timed", {});
    await waitFor("the timer calls", () => results.expected || results.error);
    assert.ifError(results.error);
    const { soon, later } = results.expected;
    assert.deepEqual(results.afterSchedule, [soon, later]);
    assert.deepEqual(results.afterUnschedule, [soon]);
    assert.deepEqual(results.afterClearAndSchedule, [later]);
    assert.deepEqual(results.afterClear, []);
    await waitFor("the timer", () => fired.length === 1, 10000);
    assert.equal(fired[0].key, "timed");
    assert.equal(fired[0].time.getTime(), soon);
  });
});

test("a context used after its handler returned rejects", () =>
  withClient({}, async (client) => {
    let kept;
    const handler = recorder({
      async onMessage(context) {
        kept = context;
        return null;
      },
    });
    await client.subscribe(handler);
    await client.send("events", "k", {});
    await waitFor("the message", () => kept);
    await sleep(50);
    await assert.rejects(kept.scheduled(), (error) => error instanceof TransientError && /attempt has ended/.test(error.message));
    assert.equal(kept.shouldCancel, true);
  }));

test("send: AbortSignal, non-JSON payloads", () =>
  withClient({}, async (client) => {
    const aborted = AbortSignal.abort(new Error("stop"));
    await assert.rejects(client.send("events", "k", {}, aborted), /stop/);
    await assert.rejects(client.excise("events", "k", aborted), /stop/);
    await assert.rejects(client.send("events", "k", undefined), TypeError);
    await assert.rejects(client.send("events", "k", {}, "not a signal"), TypeError);
    await client.send("events", "k", { ok: true }, new AbortController().signal);
    await assert.rejects(client.send("events", "", {}), (error) => error instanceof PermanentError && /key is empty/.test(error.message));
  }));

test("shutdown is idempotent, concurrent calls share it, later operations reject", async () => {
  const client = await ProsodyClient.create(mockOptions());
  await client.subscribe(recorder());
  const first = client.shutdown();
  const second = client.shutdown();
  assert.equal(first, second);
  await Promise.all([first, second, client.shutdown()]);
  assert.equal(await client.consumerState(), "shutdown");
  await assert.rejects(client.send("events", "k", {}), /shut down/);
  await assert.rejects(client.subscribe(recorder()), /shut down/);
  await client.shutdown();
});
