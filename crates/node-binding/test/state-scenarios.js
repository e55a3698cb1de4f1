// Keyed-state scenarios shared by the mock-mode and real-Kafka suites (state.*.test.js).
//
// Each scenario gets an environment `env` with `start({ collections, handler, groupId? })`,
// which creates a client registering `collections`, subscribes `handler` and resolves to
// `{ send(key, payload), excise(key), shutdown() }`. Handlers report what they saw into an
// inbox the test awaits, so nothing waits on time.
"use strict";

const assert = require("node:assert/strict");
const prosody = require("..");

const { value, map, deque, messageValue, messageMap, messageDeque } = prosody;
const { TransientError, TransientStateError, PermanentStateError, isStateError } = prosody;

/** A queue the handlers push to and the test takes from, in order. */
function inbox() {
  const items = [];
  const waiters = [];
  return {
    push(item) {
      const waiter = waiters.shift();
      if (waiter) waiter(item);
      else items.push(item);
    },
    take(what, timeoutMs = 90000) {
      if (items.length > 0) return Promise.resolve(items.shift());
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => {
          waiters.splice(waiters.indexOf(waiter), 1);
          reject(new Error(`timed out after ${timeoutMs} ms waiting for ${what}`));
        }, timeoutMs);
        const waiter = (item) => {
          clearTimeout(timer);
          resolve(item);
        };
        waiters.push(waiter);
      });
    },
    async takeAll(count, what) {
      const taken = [];
      for (let index = 0; index < count; index += 1) taken.push(await this.take(`${what} (${index + 1} of ${count})`));
      return taken;
    },
    get pending() {
      return items.length;
    },
  };
}

const noExcise = async () => null;
const noTimer = async () => {};

async function withStarted(env, options, body) {
  const running = await env.start(options);
  try {
    return await body(running);
  } finally {
    await running.shutdown();
  }
}

/** The README counter: one counter per key, cleared by an excise. */
async function counter(env) {
  const COUNT = value("count", { ttlSeconds: 30 * 24 * 60 * 60 });
  const seen = inbox();
  const handler = {
    async onMessage(context, message) {
      const count = context.state(COUNT);
      await count.set(((await count.get()) ?? 0) + 1);
      seen.push([message.key, await count.get()]);
      return null;
    },
    async onExcise(context, message) {
      await context.state(COUNT).clear();
      seen.push([message.key, "excised"]);
      return null;
    },
    async onTimer() {},
  };
  await withStarted(env, { collections: [COUNT], handler }, async (client) => {
    for (let index = 0; index < 3; index += 1) {
      await client.send("a", { index });
      await client.send("b", { index });
    }
    await client.excise("a");
    await client.send("a", { index: 3 });
    const events = await seen.takeAll(8, "counter events");
    const of = (key) => events.filter(([k]) => k === key).map(([, count]) => count);
    assert.deepEqual(of("a"), [1, 2, 3, "excised", 1], "key a counts, is cleared by the excise, starts again");
    assert.deepEqual(of("b"), [1, 2, 3], "key b has its own counter");
  });
}

/** commit() is a floor: a failed attempt's later writes are dropped, the committed ones kept. */
async function commitFloor(env) {
  const V = value("floor");
  const seen = inbox();
  let attempts = 0;
  const handler = {
    async onMessage(context) {
      attempts += 1;
      const v = context.state(V);
      const before = await v.get();
      if (attempts === 1) {
        await v.set(1);
        await v.commit();
        await v.set(2);
        assert.equal(await v.get(), 2, "reads see the handler's own pending write");
        seen.push(["first", before]);
        throw new TransientError("fail after the commit");
      }
      seen.push(["retry", before]);
      await v.set(before + 10);
      return null;
    },
    onExcise: noExcise,
    onTimer: noTimer,
  };
  await withStarted(env, { collections: [V], handler }, async (client) => {
    await client.send("k", {});
    assert.deepEqual(await seen.take("the first attempt"), ["first", undefined]);
    assert.deepEqual(await seen.take("the retry"), ["retry", 1], "the retry sees the committed value only");
    await client.send("k", {});
    assert.deepEqual(await seen.take("the next message"), ["retry", 11], "the successful retry's write committed");
  });
}

/** rollback() drops pending writes back to the last commit. */
async function rollback(env) {
  const V = value("rolled");
  const M = map("rolled-map");
  const seen = inbox();
  const handler = {
    async onMessage(context, message) {
      const v = context.state(V);
      const m = context.state(M);
      if (message.payload.step === 1) {
        await v.set("pending");
        await m.set("x", 1);
        await v.rollback();
        await m.rollback();
        const afterRollback = [await v.get(), await m.has("x")];
        await v.set("committed");
        await v.commit();
        await v.set("dropped");
        await v.rollback();
        seen.push([...afterRollback, await v.get()]);
      } else {
        seen.push([await v.get(), await m.has("x")]);
      }
      return null;
    },
    onExcise: noExcise,
    onTimer: noTimer,
  };
  await withStarted(env, { collections: [V, M], handler }, async (client) => {
    await client.send("k", { step: 1 });
    assert.deepEqual(await seen.take("step 1"), [undefined, false, "committed"]);
    await client.send("k", { step: 2 });
    assert.deepEqual(await seen.take("step 2"), ["committed", false], "rolled-back writes never land");
  });
}

/** readUncommitted: writes go through at once, so a retry sees the failed attempt's writes. */
async function readUncommitted(env) {
  const THROUGH = value("through", { readUncommitted: true });
  const STAGED = value("staged");
  const seen = inbox();
  let attempts = 0;
  const handler = {
    async onMessage(context) {
      attempts += 1;
      const through = context.state(THROUGH);
      const staged = context.state(STAGED);
      seen.push([await through.get(), await staged.get()]);
      if (attempts === 1) {
        await through.set("written");
        await staged.set("written");
        throw new TransientError("retry me");
      }
      return null;
    },
    onExcise: noExcise,
    onTimer: noTimer,
  };
  await withStarted(env, { collections: [THROUGH, STAGED], handler }, async (client) => {
    await client.send("k", {});
    assert.deepEqual(await seen.take("the first attempt"), [undefined, undefined]);
    assert.deepEqual(await seen.take("the retry"), ["written", undefined]);
  });
}

/** A handle (or iterator) kept past its attempt rejects with a transient state error. */
async function leakedHandle(env) {
  const V = value("leak");
  const M = map("leak-map");
  const seen = inbox();
  let kept;
  let keptMap;
  const handler = {
    async onMessage(context, message) {
      if (message.payload.step === 1) {
        kept = context.state(V);
        keptMap = context.state(M);
        await kept.set("from the first event");
        await keptMap.set("a", 1);
        seen.push("stored");
        return null;
      }
      const outcomes = [];
      for (const operation of [() => kept.set("late"), () => kept.get(), () => keptMap.keys().next(), () => kept.commit()]) {
        try {
          await operation();
          outcomes.push("resolved");
        } catch (error) {
          outcomes.push(error);
        }
      }
      seen.push({ outcomes, now: await context.state(V).get() });
      return null;
    },
    onExcise: noExcise,
    onTimer: noTimer,
  };
  await withStarted(env, { collections: [V, M], handler }, async (client) => {
    await client.send("k", { step: 1 });
    assert.equal(await seen.take("the first event"), "stored");
    await client.send("k", { step: 2 });
    const { outcomes, now } = await seen.take("the second event");
    for (const outcome of outcomes) {
      assert.ok(outcome instanceof TransientStateError, `rejected with a TransientStateError: ${outcome}`);
      assert.ok(isStateError(outcome));
      assert.equal(outcome.isPermanent, false);
      assert.match(outcome.message, /attempt has ended/);
    }
    assert.equal(now, "from the first event", "the leaked handle changed nothing");
  });
}

/** Map scans: key order forward and backward, chunked, merged with pending writes, early exit. */
async function mapScans(env) {
  const M = map("scan");
  const seen = inbox();
  const keys = Array.from({ length: 150 }, (_, index) => `k${String(index).padStart(3, "0")}`);
  // Insertion order is not key order.
  const shuffled = [...keys].sort((a, b) => (a.split("").reverse().join("") < b.split("").reverse().join("") ? -1 : 1));
  const handler = {
    async onMessage(context, message) {
      const m = context.state(M);
      if (message.payload.step === 1) {
        for (const key of shuffled.slice(0, 100)) await m.set(key, { n: Number(key.slice(1)) });
        seen.push("stored");
        return null;
      }
      // Half committed by the first event, half pending in this one.
      for (const key of shuffled.slice(100)) await m.set(key, { n: Number(key.slice(1)) });
      await m.delete("k010");
      const result = { forward: [], backward: [], values: [], early: [] };
      for await (const entry of m.entries()) result.forward.push(entry);
      for await (const key of m.keys("backward")) result.backward.push(key);
      for await (const item of m.values("forward")) result.values.push(item.n);
      for await (const [key] of m.entries("backward")) {
        result.early.push(key);
        if (result.early.length === 3) break;
      }
      const iterator = m.keys();
      result.firstTwo = [(await iterator.next()).value, (await iterator.next()).value];
      result.returned = await iterator.return();
      result.afterReturn = await iterator.next();
      result.many = await m.getMany(["k001", "k010", "missing", "k149"]);
      result.has = [await m.has("k005"), await m.has("k010")];
      try {
        m.entries("sideways");
      } catch (error) {
        result.badDirection = error;
      }
      seen.push(result);
      return null;
    },
    onExcise: noExcise,
    onTimer: noTimer,
  };
  await withStarted(env, { collections: [M], handler }, async (client) => {
    await client.send("k", { step: 1 });
    assert.equal(await seen.take("the first event"), "stored");
    await client.send("k", { step: 2 });
    const result = await seen.take("the scans");
    const expected = keys.filter((key) => key !== "k010");
    assert.deepEqual(result.forward.map(([key]) => key), expected, "forward in key order");
    assert.deepEqual(result.forward[0], ["k000", { n: 0 }]);
    assert.deepEqual(result.backward, [...expected].reverse(), "backward in reverse key order");
    assert.deepEqual(result.values, expected.map((key) => Number(key.slice(1))));
    assert.deepEqual(result.early, ["k149", "k148", "k147"], "an early break stops the scan");
    assert.deepEqual(result.firstTwo, ["k000", "k001"]);
    assert.deepEqual(result.returned, { value: undefined, done: true });
    assert.deepEqual(result.afterReturn, { value: undefined, done: true }, "a returned iterator stays done");
    assert.deepEqual(result.many, [{ n: 1 }, undefined, undefined, { n: 149 }]);
    assert.deepEqual(result.has, [true, false]);
    assert.ok(result.badDirection instanceof TransientStateError, `bad direction: ${result.badDirection}`);
  });
}

/** Deque: capacity evicts the oldest on push; every operation; state survives the event. */
async function dequeCapacity(env) {
  const D = deque("window", { capacity: 3 });
  const seen = inbox();
  const handler = {
    async onMessage(context, message) {
      const d = context.state(D);
      if (message.payload.step === 1) {
        for (let n = 1; n <= 5; n += 1) await d.push(n);
        seen.push("pushed");
        return null;
      }
      const result = { values: [] };
      for await (const item of d.values()) result.values.push(item);
      result.backward = [];
      for await (const item of d.values("backward")) result.backward.push(item);
      result.length = await d.length();
      result.at = [await d.at(0), await d.at(-1), await d.at(7)];
      result.pop = await d.pop();
      result.shift = await d.shift();
      await d.unshift(0);
      result.afterUnshift = [];
      for await (const item of d.values()) result.afterUnshift.push(item);
      result.isEmpty = await d.isEmpty();
      await d.clear();
      result.cleared = [await d.isEmpty(), await d.length(), await d.pop()];
      seen.push(result);
      return null;
    },
    onExcise: noExcise,
    onTimer: noTimer,
  };
  await withStarted(env, { collections: [D], handler }, async (client) => {
    await client.send("k", { step: 1 });
    assert.equal(await seen.take("the pushes"), "pushed");
    await client.send("k", { step: 2 });
    const result = await seen.take("the reads");
    assert.deepEqual(result.values, [3, 4, 5], "pushing past capacity dropped the oldest");
    assert.deepEqual(result.backward, [5, 4, 3]);
    assert.equal(result.length, 3);
    assert.deepEqual(result.at, [3, 5, undefined]);
    assert.equal(result.pop, 5);
    assert.equal(result.shift, 3);
    assert.deepEqual(result.afterUnshift, [0, 4]);
    assert.equal(result.isEmpty, false);
    assert.deepEqual(result.cleared, [true, 0, undefined]);
  });
}

/** Message collections store a reference and reload the record. */
async function messageCollections(env) {
  const LAST = messageValue("last");
  const BY_KIND = messageMap("by-kind");
  const HISTORY = messageDeque("history", { capacity: 2 });
  const seen = inbox();
  const handler = {
    async onMessage(context, message) {
      const last = context.state(LAST);
      const byKind = context.state(BY_KIND);
      const history = context.state(HISTORY);
      const previous = await last.get();
      const sameKind = await byKind.get(message.payload.kind);
      const older = [];
      for await (const item of history.values()) older.push(item.payload.n);
      const entries = [];
      for await (const [kind, item] of byKind.entries()) entries.push([kind, item.payload.n]);
      await last.set(message);
      await byKind.set(message.payload.kind, message);
      await history.push(message);
      seen.push({ message, previous, sameKind, older, entries });
      return null;
    },
    onExcise: noExcise,
    onTimer: noTimer,
  };
  await withStarted(env, { collections: [LAST, BY_KIND, HISTORY], handler }, async (client) => {
    const kinds = ["red", "blue", "red", "green"];
    const results = [];
    for (const [n, kind] of kinds.entries()) {
      await client.send("user", { n, kind });
      results.push(await seen.take(`message ${n}`));
    }
    assert.equal(results[0].previous, undefined);
    for (let n = 1; n < kinds.length; n += 1) {
      const { previous } = results[n];
      const stored = results[n - 1].message;
      assert.deepEqual(
        { ...previous, timestamp: previous.timestamp.getTime() },
        { ...stored, timestamp: stored.timestamp.getTime() },
        `message ${n} reloads the previous record`,
      );
      assert.ok(previous.timestamp instanceof Date);
    }
    assert.equal(results[2].sameKind.payload.n, 0, "the map reloads the record stored under the entry");
    assert.equal(results[1].sameKind, undefined);
    assert.deepEqual(results[3].older, [1, 2], "the deque keeps the two newest references");
    assert.deepEqual(results[3].entries, [["blue", 1], ["red", 2]]);
  });
}

/** State errors escaping a handler keep their class: permanent ones are not retried. */
async function errorClassification(env) {
  const COUNT = value("count");
  const attempts = new Map();
  const seen = inbox();
  const handler = {
    async onMessage(context, message) {
      const n = (attempts.get(message.key) ?? 0) + 1;
      attempts.set(message.key, n);
      seen.push([message.key, n, message.payload.n]);
      if (message.key === "mismatch") context.state(deque("count"));
      if (message.key === "unregistered") context.state(value("never-registered"));
      if (message.key === "bad-item" && n === 1) await context.state(COUNT).set(undefined);
      if (message.key === "bigint" && n === 1) await context.state(COUNT).set(1n);
      return null;
    },
    onExcise: noExcise,
    onTimer: noTimer,
  };
  await withStarted(env, { collections: [COUNT], handler }, async (client) => {
    for (const key of ["mismatch", "unregistered", "bad-item", "bigint"]) {
      await client.send(key, { n: 1 });
      await client.send(key, { n: 2 });
    }
    // [attempt number, record]: a permanent failure moves on to the key's next record, a
    // transient one retries the same record first.
    const events = await seen.takeAll(10, "attempts");
    const of = (key) => events.filter(([k]) => k === key).map(([, n, record]) => [n, record]);
    assert.deepEqual(of("mismatch"), [[1, 1], [2, 2]], "a mismatched definition fails permanently (no retry)");
    assert.deepEqual(of("unregistered"), [[1, 1], [2, 2]], "an unregistered collection fails permanently (no retry)");
    assert.deepEqual(of("bad-item"), [[1, 1], [2, 1], [3, 2]], "storing undefined fails transiently (retried)");
    assert.deepEqual(of("bigint"), [[1, 1], [2, 1], [3, 2]], "a non-JSON item fails transiently (retried)");
  });
}

/** The thrown classes themselves, caught in the handler. */
async function errorClasses(env) {
  const COUNT = value("count");
  const seen = inbox();
  const handler = {
    async onMessage(context) {
      const caught = {};
      try {
        context.state(map("count"));
      } catch (error) {
        caught.mismatch = error;
      }
      try {
        context.state(messageValue("count"));
      } catch (error) {
        caught.payload = error;
      }
      try {
        context.state(value("nope"));
      } catch (error) {
        caught.unregistered = error;
      }
      try {
        await context.state(COUNT).set(null);
      } catch (error) {
        caught.nullItem = error;
      }
      seen.push(caught);
      return null;
    },
    onExcise: noExcise,
    onTimer: noTimer,
  };
  await withStarted(env, { collections: [COUNT], handler }, async (client) => {
    await client.send("k", {});
    const caught = await seen.take("the caught errors");
    for (const name of ["mismatch", "payload", "unregistered"]) {
      assert.ok(caught[name] instanceof PermanentStateError, `${name}: ${caught[name]}`);
      assert.ok(isStateError(caught[name]));
      assert.equal(caught[name].isPermanent, true);
    }
    assert.match(caught.mismatch.message, /`count` is a .*value.*not a .*map/);
    assert.match(caught.unregistered.message, /`nope` is not registered/);
    assert.ok(caught.nullItem instanceof TransientStateError, `null item: ${caught.nullItem}`);
    assert.equal(isStateError(new Error("x")), false);
  });
}

module.exports = {
  inbox,
  counter,
  commitFloor,
  rollback,
  readUncommitted,
  leakedHandle,
  mapScans,
  dequeCapacity,
  messageCollections,
  errorClassification,
  errorClasses,
};
