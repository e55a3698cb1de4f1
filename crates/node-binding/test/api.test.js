// API surface that needs no Kafka at all: configuration errors, handler validation, error
// classes and decorators, definitions, logging.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const prosody = require("..");
const {
  ProsodyClient,
  AdminClient,
  Mode,
  ConsumerState,
  EventHandlerError,
  TransientError,
  PermanentError,
  TransientStateError,
  PermanentStateError,
  isStateError,
  transient,
  permanent,
} = prosody;
const { mockOptions, recorder } = require("./helpers");

test("exports the seed's surface", () => {
  for (const name of [
    "ProsodyClient", "AdminClient", "Mode", "ConsumerState", "EventHandlerError", "TransientError",
    "PermanentError", "TransientStateError", "PermanentStateError", "isStateError", "transient",
    "permanent", "value", "map", "deque", "messageValue", "messageMap", "messageDeque", "setLogger",
    "setLoggerIfUnset", "loggerIsSet", "getCurrentLogger", "initialize", "flushTelemetry",
    "shutdownTelemetry",
  ]) {
    assert.ok(prosody[name] !== undefined, `${name} is exported`);
  }
  assert.deepEqual(Mode, { Pipeline: "pipeline", LowLatency: "low-latency", BestEffort: "best-effort" });
  assert.equal(ConsumerState.Running, "running");
});

test("the constructor is private: create() is the way in", () => {
  assert.throws(() => new ProsodyClient({}), /ProsodyClient\.create/);
});

test("config errors name the option", async () => {
  await assert.rejects(ProsodyClient.create(mockOptions({ maxConcurrency: "many" })), /maxConcurrency/);
  await assert.rejects(ProsodyClient.create(mockOptions({ maxConcurrency: 0 })), /maxConcurrency/);
  await assert.rejects(ProsodyClient.create(mockOptions({ noSuchOption: 1 })), /noSuchOption/);
  await assert.rejects(ProsodyClient.create(mockOptions({ mode: "fastest" })), (error) => {
    assert.match(error.message, /mode/);
    assert.match(error.message, /pipeline/);
    assert.equal(error.code, "ERR_PROSODY_CONFIG");
    return true;
  });
  await assert.rejects(ProsodyClient.create(mockOptions({ mode: Mode.LowLatency })), /failureTopic/);
  await assert.rejects(ProsodyClient.create(mockOptions({ commitIntervalMs: "soon" })), /commitIntervalMs/);
  await assert.rejects(ProsodyClient.create("nope"), TypeError);
});

test("environment variables fill unset options; options win", async () => {
  try {
    process.env.PROSODY_SOURCE_SYSTEM = "from-env";
    const fromEnv = await ProsodyClient.create(mockOptions({ sourceSystem: undefined }));
    assert.equal(fromEnv.sourceSystem, "from-env");
    await fromEnv.shutdown();
    const fromOption = await ProsodyClient.create(mockOptions({ sourceSystem: "from-option" }));
    assert.equal(fromOption.sourceSystem, "from-option");
    await fromOption.shutdown();
    process.env.PROSODY_MAX_CONCURRENCY = "zero";
    await assert.rejects(ProsodyClient.create(mockOptions()), /maxConcurrency \(PROSODY_MAX_CONCURRENCY\)/);
  } finally {
    delete process.env.PROSODY_SOURCE_SYSTEM;
    delete process.env.PROSODY_MAX_CONCURRENCY;
  }
});

test("subscribe rejects a handler missing a method, naming it, before consuming", async () => {
  const client = await ProsodyClient.create(mockOptions());
  try {
    for (const method of ["onMessage", "onExcise", "onTimer"]) {
      const handler = recorder();
      delete handler[method];
      await assert.rejects(client.subscribe(handler), (error) => {
        assert.ok(error instanceof TypeError);
        assert.match(error.message, new RegExp(`missing ${method}`));
        return true;
      });
      assert.equal(await client.consumerState(), "configured");
    }
    await assert.rejects(client.subscribe(null), TypeError);
  } finally {
    await client.shutdown();
  }
});

test("error classes", () => {
  assert.throws(() => new EventHandlerError("x"), TypeError);
  const transientError = new TransientError("busy");
  const permanentError = new PermanentError("bad");
  assert.equal(transientError.isPermanent, false);
  assert.equal(permanentError.isPermanent, true);
  assert.ok(transientError instanceof EventHandlerError && transientError instanceof Error);
  assert.equal(permanentError.name, "PermanentError");
  assert.ok(new TransientStateError("s") instanceof TransientError);
  assert.ok(new PermanentStateError("s") instanceof PermanentError);
  assert.ok(isStateError(new PermanentStateError("s")));
  assert.ok(!isStateError(new PermanentError("s")));
});

test("decorators tag matching errors and leave others alone", async () => {
  // Node 20 has no decorator syntax: apply the decorator as TypeScript's emit does (TC39 form
  // for onMessage, legacy experimentalDecorators form for onExcise).
  class Handler {
    async onMessage(context, message) {
      if (message === "type") throw new TypeError("t");
      if (message === "transient") throw new TransientError("still transient");
      throw new RangeError("r");
    }
    async onExcise() {
      throw new TypeError("t");
    }
  }
  Handler.prototype.onMessage = permanent(TypeError)(Handler.prototype.onMessage, { kind: "method", name: "onMessage" });
  const descriptor = Object.getOwnPropertyDescriptor(Handler.prototype, "onExcise");
  Object.defineProperty(Handler.prototype, "onExcise", permanent(TypeError)(Handler.prototype, "onExcise", descriptor));
  const handler = new Handler();
  const marker = Symbol.for("@prosody-events/prosody.errorClass");
  await assert.rejects(handler.onMessage(null, "type"), (error) => error instanceof TypeError && error[marker] === "permanent");
  await assert.rejects(handler.onMessage(null, "range"), (error) => error instanceof RangeError && error[marker] === undefined);
  await assert.rejects(handler.onMessage(null, "transient"), (error) => error[marker] === undefined);
  await assert.rejects(handler.onExcise(), (error) => error[marker] === "permanent");

  const wrapped = transient(SyntaxError)(async () => {
    throw new SyntaxError("s");
  });
  await assert.rejects(wrapped(), (error) => error[marker] === "transient");
  assert.throws(() => permanent("not a class"), TypeError);
});

test("definitions are frozen data usable in stateCollections", () => {
  const count = prosody.value("count", { ttlSeconds: 60 });
  assert.deepEqual({ ...count }, { name: "count", kind: "value", payload: "json", ttlSeconds: 60 });
  assert.ok(Object.isFrozen(count));
  assert.equal(prosody.messageDeque("pending", { capacity: 10 }).payload, "message");
  assert.throws(() => prosody.map(""), TypeError);
});

test("logging bridge: Rust log records reach the JavaScript logger", async () => {
  const lines = [];
  const logger = Object.fromEntries(
    ["error", "warn", "info", "debug", "trace"].map((level) => [level, (message) => lines.push([level, message])]),
  );
  assert.equal(prosody.loggerIsSet(), false);
  assert.ok(prosody.getCurrentLogger().info);
  assert.equal(prosody.setLoggerIfUnset(logger), true);
  assert.equal(prosody.setLoggerIfUnset({ ...logger }), false);
  assert.equal(prosody.getCurrentLogger(), logger);
  assert.equal(prosody.loggerIsSet(), true);
  assert.throws(() => prosody.setLogger({ info() {} }), /missing error, warn, debug, trace/);
  prosody.initialize();
  const client = await ProsodyClient.create(mockOptions());
  await client.shutdown();
  const { waitFor } = require("./helpers");
  await waitFor("a log line", () => lines.some(([level, message]) => level === "info" && /prosody client created/.test(message)));
  await prosody.flushTelemetry();
  await prosody.shutdownTelemetry();
});

test("AdminClient needs bootstrap servers", () => {
  const saved = process.env.PROSODY_BOOTSTRAP_SERVERS;
  delete process.env.PROSODY_BOOTSTRAP_SERVERS;
  try {
    assert.throws(() => new AdminClient(), /bootstrap servers/);
  } finally {
    if (saved !== undefined) process.env.PROSODY_BOOTSTRAP_SERVERS = saved;
  }
});
