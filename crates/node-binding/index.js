// @prosody-events/prosody: the JavaScript face of the Rust Prosody client.
//
// Everything that decides behaviour (configuration, ordering, retries, offsets, timers) lives in
// Rust. This file only adapts idioms: classes and promises, AbortSignal, JavaScript error classes
// and decorators, and the objects handlers receive.
"use strict";

const native = require("./native");

// ---------------------------------------------------------------------------------------------
// Errors

/** Base class of handler errors; subclasses say whether a retry can help. */
class EventHandlerError extends Error {
  constructor(message, options) {
    super(message, options);
    if (new.target === EventHandlerError) {
      throw new TypeError("EventHandlerError is abstract: throw a TransientError or a PermanentError");
    }
    this.name = new.target.name;
  }
}

/** A failure a retry may fix. */
class TransientError extends EventHandlerError {
  get isPermanent() {
    return false;
  }
}

/** A failure a retry cannot fix: the event is not retried. */
class PermanentError extends EventHandlerError {
  get isPermanent() {
    return true;
  }
}

/** A keyed-state error that a retry can fix. */
class TransientStateError extends TransientError {}

/** A keyed-state error that another attempt cannot resolve. */
class PermanentStateError extends PermanentError {}

function isStateError(error) {
  return error instanceof TransientStateError || error instanceof PermanentStateError;
}

// Set by the transient/permanent decorators on errors they classify.
const ERROR_CLASS = Symbol.for("@prosody-events/prosody.errorClass");

// On methods wrapped by the decorators: the method they wrap.
const WRAPPED = Symbol("@prosody-events/prosody.wrapped");

/** True when a thrown value is classified permanent; everything else is transient. */
function classifyPermanent(error) {
  if (error === null || (typeof error !== "object" && typeof error !== "function")) return false;
  const tagged = error[ERROR_CLASS];
  if (tagged === "permanent" || tagged === "transient") return tagged === "permanent";
  return error.isPermanent === true;
}

function describeError(error) {
  if (error instanceof Error) return `${error.name}: ${error.message}`;
  try {
    return `thrown value: ${typeof error === "string" ? error : JSON.stringify(error)}`;
  } catch {
    return `thrown value: ${String(error)}`;
  }
}

const NATIVE_PREFIX = /^\[prosody (transient|permanent) (\w+)\] /;

/** Turns an error from the addon into the JavaScript error class its prefix names. */
function translate(error, signal) {
  const match = error instanceof Error ? NATIVE_PREFIX.exec(error.message) : null;
  if (!match) return error;
  const [, klass, kind] = match;
  const message = error.message.slice(match[0].length);
  if (kind === "cancelled" && signal?.aborted) return signal.reason;
  let result;
  if (kind === "config") {
    result = new Error(message);
  } else if (kind === "state") {
    result = klass === "permanent" ? new PermanentStateError(message) : new TransientStateError(message);
  } else {
    result = klass === "permanent" ? new PermanentError(message) : new TransientError(message);
  }
  result.code = `ERR_PROSODY_${kind.toUpperCase()}`;
  return result;
}

async function call(operation, signal) {
  try {
    return await operation();
  } catch (error) {
    throw translate(error, signal);
  }
}

// ---------------------------------------------------------------------------------------------
// Decorators: transient(...types) / permanent(...types)

function isClass(value) {
  return typeof value === "function" && /^class[\s{]/.test(Function.prototype.toString.call(value));
}

function errorClassDecorator(errorClass, errorTypes) {
  for (const type of errorTypes) {
    if (typeof type !== "function") {
      throw new TypeError(`${errorClass}(...) expects error classes, got ${typeof type}`);
    }
  }
  const matches = (error) =>
    error !== null &&
    typeof error === "object" &&
    !(error instanceof EventHandlerError) &&
    errorTypes.some((type) => error instanceof type);

  const tag = (error) => {
    if (!matches(error)) return error;
    if (Object.isExtensible(error)) {
      Object.defineProperty(error, ERROR_CLASS, { value: errorClass, configurable: true });
      return error;
    }
    const Wrapper = errorClass === "permanent" ? PermanentError : TransientError;
    return new Wrapper(describeError(error), { cause: error });
  };

  const wrapMethod = (method) => {
    const wrapped = async function (...args) {
      try {
        return await method.apply(this, args);
      } catch (error) {
        throw tag(error);
      }
    };
    Object.defineProperty(wrapped, "name", { value: method.name });
    Object.defineProperty(wrapped, "length", { value: method.length });
    Object.defineProperty(wrapped, WRAPPED, { value: method });
    return wrapped;
  };

  const wrapClass = (Class) => {
    for (const name of ["onMessage", "onExcise", "onTimer"]) {
      const descriptor = Object.getOwnPropertyDescriptor(Class.prototype, name);
      if (descriptor && typeof descriptor.value === "function") {
        Object.defineProperty(Class.prototype, name, { ...descriptor, value: wrapMethod(descriptor.value) });
      }
    }
    return Class;
  };

  return function decorator(target, context, descriptor) {
    // TC39 decorators: (value, context).
    if (context !== null && typeof context === "object" && "kind" in context) {
      if (context.kind === "method") return wrapMethod(target);
      if (context.kind === "class") return wrapClass(target);
      throw new TypeError(`${errorClass}(...) decorates methods and classes, not ${context.kind}s`);
    }
    // Legacy (experimentalDecorators) method decorators: (prototype, name, descriptor).
    if (descriptor !== undefined && typeof descriptor.value === "function") {
      return { ...descriptor, value: wrapMethod(descriptor.value) };
    }
    if (typeof target === "function") return isClass(target) ? wrapClass(target) : wrapMethod(target);
    throw new TypeError(`${errorClass}(...) decorates methods, classes or functions`);
  };
}

/** A decorator that classifies the listed error types thrown by a handler as transient. */
function transient(...errorTypes) {
  return errorClassDecorator("transient", errorTypes);
}

/** A decorator that classifies the listed error types thrown by a handler as permanent. */
function permanent(...errorTypes) {
  return errorClassDecorator("permanent", errorTypes);
}

// ---------------------------------------------------------------------------------------------
// AbortSignal -> CancelToken

function checkSignal(signal) {
  if (signal !== undefined && signal !== null && !(signal instanceof AbortSignal)) {
    throw new TypeError("signal must be an AbortSignal");
  }
}

async function withSignal(signal, operation) {
  checkSignal(signal);
  if (!signal) return call(() => operation(undefined));
  if (signal.aborted) throw signal.reason;
  const token = new native.CancelToken();
  const onAbort = () => token.cancel();
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    return await call(() => operation(token), signal);
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}

// ---------------------------------------------------------------------------------------------
// Handlers, contexts and attempts

// Live handler attempts by id: the AbortController of each is created on first use.
const attempts = new Map();

class Attempt {
  constructor() {
    this.controller = undefined;
    this.aborted = false;
  }

  get signal() {
    if (this.controller === undefined) {
      this.controller = new AbortController();
      if (this.aborted) this.controller.abort();
    }
    return this.controller.signal;
  }

  abort() {
    if (this.aborted) return;
    this.aborted = true;
    this.controller?.abort();
  }
}

function abortAttempt(id) {
  attempts.get(id)?.abort();
}

const TIMER_OPS = { schedule: 0, clearAndSchedule: 1, unschedule: 2, clearScheduled: 3, scheduled: 4 };

function timerSeconds(time) {
  const millis = time instanceof Date ? time.getTime() : time;
  if (typeof millis !== "number" || !Number.isFinite(millis)) {
    throw new TypeError("a timer time must be a valid Date (or milliseconds since the epoch)");
  }
  return Math.floor(millis / 1000);
}

/** What a handler can do during one event: timers of its key, cancellation, keyed state. */
class Context {
  #id;
  #attempt;

  constructor(id, attempt) {
    this.#id = id;
    this.#attempt = attempt;
  }

  /** True once the event was asked to stop (timeout, rebalance, shutdown). */
  get shouldCancel() {
    return this.#attempt.aborted || native.contextShouldCancel(this.#id);
  }

  /** Resolves when the event is asked to stop. */
  onCancel() {
    const signal = this.#attempt.signal;
    if (signal.aborted) return Promise.resolve();
    return new Promise((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
  }

  async schedule(time) {
    await call(() => native.contextTimers(this.#id, TIMER_OPS.schedule, timerSeconds(time)));
  }

  async clearAndSchedule(time) {
    await call(() => native.contextTimers(this.#id, TIMER_OPS.clearAndSchedule, timerSeconds(time)));
  }

  async unschedule(time) {
    await call(() => native.contextTimers(this.#id, TIMER_OPS.unschedule, timerSeconds(time)));
  }

  async clearScheduled() {
    await call(() => native.contextTimers(this.#id, TIMER_OPS.clearScheduled, null));
  }

  async scheduled() {
    const seconds = await call(() => native.contextTimers(this.#id, TIMER_OPS.scheduled, null));
    return seconds.map((secs) => new Date(secs * 1000));
  }

  /** Binds a registered collection for the current attempt (valid until the handler settles). */
  state(definition) {
    checkDefinition(definition);
    const code = KIND_CODES[definition.kind] + (definition.payload === "message" ? 3 : 0);
    let handle;
    try {
      handle = native.contextState(this.#id, code, definition.name);
    } catch (error) {
      throw stateError(error);
    }
    const codec = definition.payload === "message" ? MESSAGE_CODEC : JSON_CODEC;
    if (definition.kind === "value") return new ValueStateHandle(handle, codec);
    if (definition.kind === "map") return new MapStateHandle(handle, codec);
    return new DequeStateHandle(handle, codec);
  }
}

// ---------------------------------------------------------------------------------------------
// Keyed-state handles: promise-returning methods and async iterators over the Rust handles.
// Every operation is one call into the addon; items cross as JSON text.

const KIND_CODES = { value: 0, map: 1, deque: 2 };

/** A state error from the addon keeps its class; anything else it throws is a bad argument. */
function stateError(error) {
  if (isStateError(error)) return error;
  const translated = translate(error);
  if (translated !== error) return translated;
  const result = new TransientStateError(error instanceof Error ? error.message : String(error));
  result.code = "ERR_PROSODY_STATE";
  return result;
}

function rethrowState(error) {
  throw stateError(error);
}

/**
 * One operation on a Rust handle: its promise, with `then` applied to the result and errors
 * turned into state errors. Plain promise chaining, no async wrapper: this is the per-call cost.
 */
function stateOp(operation, then) {
  let promise;
  try {
    promise = operation();
  } catch (error) {
    return Promise.reject(stateError(error));
  }
  return then === undefined ? promise.catch(rethrowState) : promise.then(then, rethrowState);
}

async function stateCall(operation) {
  try {
    return await operation();
  } catch (error) {
    throw stateError(error);
  }
}

function badItem(error) {
  const result = new TransientStateError(`a keyed-state item must be JSON-compatible: ${describeError(error)}`);
  result.code = "ERR_PROSODY_STATE";
  return result;
}

// `undefined` is sent as null, which Rust rejects: null and undefined mean absence.
const JSON_CODEC = {
  encode(item) {
    let text;
    try {
      text = JSON.stringify(item);
    } catch (error) {
      throw badItem(error);
    }
    return text === undefined ? "null" : text;
  },
  decode: (item) => item,
  decodeText: (text) => (text === null ? undefined : JSON.parse(text)),
};

// Message collections store the record's reference and reload it from Kafka on read.
const MESSAGE_CODEC = {
  encode(message) {
    if (message === null || typeof message !== "object") return "null";
    return JSON.stringify([message.topic, message.partition, message.offset]);
  },
  decode: decodeMessage,
  decodeText: (text) => (text === null ? undefined : decodeMessage(JSON.parse(text))),
};

function decodeMessage([topic, partition, offset, timestamp, key, payload]) {
  return { topic, partition, offset, timestamp: new Date(timestamp), key, payload };
}

const SCAN_ENTRIES = 0;
const SCAN_KEYS = 1;
const SCAN_VALUES = 2;
// Chunks grow from small (a loop that stops early reads little) to large (a long scan makes
// few calls).
const FIRST_CHUNK = 16;
const LARGEST_CHUNK = 1024;

/** An async iterator over a Rust scan cursor; `return()` (an early `break`) closes it. */
class StateIterator {
  #cursor;
  #decode;
  #buffer = [];
  #index = 0;
  #chunk = FIRST_CHUNK;
  #done = false;
  #pending = Promise.resolve();

  constructor(cursor, decode) {
    this.#cursor = cursor;
    this.#decode = decode;
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  next() {
    // Calls queue so that concurrent next() calls see items in order.
    const step = this.#pending.then(() => this.#step());
    this.#pending = step.then(
      () => undefined,
      () => undefined,
    );
    return step;
  }

  async #step() {
    if (this.#index >= this.#buffer.length) {
      if (this.#done) return { value: undefined, done: true };
      let text;
      try {
        text = await stateCall(() => this.#cursor.next(this.#chunk));
      } catch (error) {
        this.#finish();
        throw error;
      }
      if (text === null) {
        this.#finish();
        return { value: undefined, done: true };
      }
      this.#buffer = JSON.parse(text);
      this.#index = 0;
      this.#chunk = Math.min(this.#chunk * 4, LARGEST_CHUNK);
    }
    return { value: this.#decode(this.#buffer[this.#index++]), done: false };
  }

  #finish() {
    this.#done = true;
    this.#buffer = [];
    this.#index = 0;
    this.#cursor.close();
  }

  async return(value) {
    this.#finish();
    return { value, done: true };
  }
}

/** A lazy scan of a Rust handle; a bad direction throws here, as the scan is opened. */
function scan(handle, what, direction, decode) {
  let cursor;
  try {
    cursor = handle.scan(what, direction === undefined ? "forward" : String(direction));
  } catch (error) {
    throw stateError(error);
  }
  return new StateIterator(cursor, decode);
}

// Where a handle keeps its Rust handle and codec (symbols keep them off the public surface).
const NATIVE = Symbol("native");
const CODEC = Symbol("codec");

/** Transaction control shared by every handle. */
class StagedHandle {
  constructor(handle, codec) {
    Object.defineProperty(this, NATIVE, { value: handle });
    Object.defineProperty(this, CODEC, { value: codec });
  }

  /** Makes this collection's pending writes durable now; a later failure keeps them. */
  commit() {
    return stateOp(() => this[NATIVE].commit());
  }

  /** Drops this collection's pending writes since its last commit. */
  rollback() {
    return stateOp(() => this[NATIVE].rollback());
  }
}

/** A value collection of the current key. */
class ValueStateHandle extends StagedHandle {
  get() {
    return stateOp(() => this[NATIVE].get(null), this[CODEC].decodeText);
  }

  set(item) {
    return stateOp(() => this[NATIVE].set(null, this[CODEC].encode(item)));
  }

  clear() {
    return stateOp(() => this[NATIVE].clear());
  }
}

/** A string-keyed ordered map of the current key. */
class MapStateHandle extends StagedHandle {
  get(key) {
    return stateOp(() => this[NATIVE].get(key), this[CODEC].decodeText);
  }

  getMany(keys) {
    const { decode } = this[CODEC];
    return stateOp(
      () => this[NATIVE].getMany(keys),
      (text) => JSON.parse(text).map((item) => (item === null ? undefined : decode(item))),
    );
  }

  has(key) {
    return stateOp(() => this[NATIVE].has(key));
  }

  set(key, item) {
    return stateOp(() => this[NATIVE].set(key, this[CODEC].encode(item)));
  }

  delete(key) {
    return stateOp(() => this[NATIVE].delete(key));
  }

  clear() {
    return stateOp(() => this[NATIVE].clear());
  }

  entries(scanDirection) {
    const { decode } = this[CODEC];
    return scan(this[NATIVE], SCAN_ENTRIES, scanDirection, ([key, item]) => [key, decode(item)]);
  }

  keys(scanDirection) {
    return scan(this[NATIVE], SCAN_KEYS, scanDirection, (key) => key);
  }

  values(scanDirection) {
    return scan(this[NATIVE], SCAN_VALUES, scanDirection, this[CODEC].decode);
  }
}

/** A double-ended queue of the current key. */
class DequeStateHandle extends StagedHandle {
  push(item) {
    return stateOp(() => this[NATIVE].insert(true, this[CODEC].encode(item)));
  }

  unshift(item) {
    return stateOp(() => this[NATIVE].insert(false, this[CODEC].encode(item)));
  }

  pop() {
    return stateOp(() => this[NATIVE].remove(true), this[CODEC].decodeText);
  }

  shift() {
    return stateOp(() => this[NATIVE].remove(false), this[CODEC].decodeText);
  }

  at(index) {
    return stateOp(() => this[NATIVE].at(index), this[CODEC].decodeText);
  }

  length() {
    return stateOp(() => this[NATIVE].length());
  }

  isEmpty() {
    return stateOp(() => this[NATIVE].isEmpty());
  }

  values(scanDirection) {
    return scan(this[NATIVE], SCAN_VALUES, scanDirection, this[CODEC].decode);
  }

  clear() {
    return stateOp(() => this[NATIVE].clear());
  }
}

const MESSAGE = 0;
const EXCISE = 1;

// Settled handlers waiting to be reported to Rust in one call.
let settledOk = [];
let settledOther = [];
let flushQueued = false;

function flushSettled() {
  flushQueued = false;
  const ok = Uint32Array.from(settledOk);
  const others = settledOther.length > 0 ? JSON.stringify(settledOther) : null;
  settledOk = [];
  settledOther = [];
  native.completeEvents(ok, others);
}

function settle(id, reply) {
  attempts.delete(id);
  if (reply === undefined) settledOk.push(id);
  else settledOther.push([id, reply.response ?? null, reply.error ?? null, reply.permanent === true]);
  if (!flushQueued) {
    flushQueued = true;
    queueMicrotask(flushSettled);
  }
}

function success(kind, value) {
  if (kind > EXCISE || value === undefined || value === null) return undefined;
  let response;
  try {
    response = JSON.stringify(value);
  } catch (error) {
    return { error: `the handler's answer cannot be encoded as JSON: ${describeError(error)}`, permanent: true };
  }
  if (response === undefined) {
    return { error: `the handler's answer (${typeof value}) cannot be encoded as JSON`, permanent: true };
  }
  return { response };
}

function failure(error) {
  return { error: describeError(error), permanent: classifyPermanent(error) };
}

// Building an AbortSignal is the most expensive thing done per event in Node.js 20 (several
// microseconds and most of the garbage per event, more than the rest of the delivery path
// together), so a handler that cannot receive its third argument gets none. The check reads
// the function's source once and errs towards building the signal: it is skipped only when
// the function declares fewer than three parameters, its parameter list is plain names (no
// default value or rest parameter, which `length` does not count, and no destructuring, which
// could hide one), and nothing in it could reach `arguments` (or `eval`). Decorated methods are
// judged by the method they wrap.
const takesSignalCache = new WeakMap();

function takesSignal(fn) {
  let takes = takesSignalCache.get(fn);
  if (takes === undefined) {
    takes = judgeTakesSignal(fn);
    takesSignalCache.set(fn, takes);
  }
  return takes;
}

function judgeTakesSignal(fn) {
  if (typeof fn[WRAPPED] === "function") return takesSignal(fn[WRAPPED]);
  if (fn.length >= 3) return true;
  let source;
  try {
    source = Function.prototype.toString.call(fn);
  } catch {
    return true;
  }
  if (/\[native code\]|arguments|eval|\.\.\./.test(source)) return true;
  const arrow = source.indexOf("=>");
  const open = source.indexOf("(");
  // `message => ...`: one bare parameter before the arrow.
  if (arrow !== -1 && (open === -1 || arrow < open)) {
    return !/^\s*(async\s+)?[\w$]+\s*$/.test(source.slice(0, arrow));
  }
  const close = open === -1 ? -1 : source.indexOf(")", open);
  if (close === -1) return true;
  // Plain names only: a default, a destructuring pattern or a comment could hide a parameter.
  return /[=[{(/]/.test(source.slice(open + 1, close));
}

function start(handler, event) {
  const kind = event[0];
  const id = event[1];
  const attempt = new Attempt();
  attempts.set(id, attempt);
  const context = new Context(id, attempt);
  let result;
  try {
    if (kind === MESSAGE) {
      const [, , key, topic, partition, offset, timestamp, payload] = event;
      const message = { topic, partition, offset, timestamp: new Date(timestamp), key, payload };
      const onMessage = handler.onMessage;
      result = onMessage.call(handler, context, message, takesSignal(onMessage) ? attempt.signal : undefined);
    } else if (kind === EXCISE) {
      const [, , key, topic, partition, offset, timestamp] = event;
      const onExcise = handler.onExcise;
      const message = { topic, partition, offset, timestamp: new Date(timestamp), key };
      result = onExcise.call(handler, context, message, takesSignal(onExcise) ? attempt.signal : undefined);
    } else {
      const [, , key, time] = event;
      const onTimer = handler.onTimer;
      result = onTimer.call(handler, context, { key, time: new Date(time) }, takesSignal(onTimer) ? attempt.signal : undefined);
    }
  } catch (error) {
    settle(id, failure(error));
    return;
  }
  if (result !== null && typeof result === "object" && typeof result.then === "function") {
    result.then(
      (value) => settle(id, success(kind, value)),
      (error) => settle(id, failure(error)),
    );
  } else {
    settle(id, success(kind, result));
  }
}

/** The function Rust calls with each batch of events (JSON text); it never throws. */
function deliverer(handler) {
  return function deliver(batch) {
    for (const event of JSON.parse(batch)) start(handler, event);
  };
}

const HANDLER_METHODS = ["onMessage", "onExcise", "onTimer"];

// ---------------------------------------------------------------------------------------------
// Client

const CONSTRUCT = Symbol("construct");

/** Consumer lifecycle states. */
const ConsumerState = Object.freeze({
  Unconfigured: "unconfigured",
  Configured: "configured",
  Running: "running",
  ShutDown: "shutdown",
});

/** Processing modes. */
const Mode = Object.freeze({
  Pipeline: "pipeline",
  LowLatency: "low-latency",
  BestEffort: "best-effort",
});

class ProsodyClient {
  #native;
  #shutdown;

  /** Use `await ProsodyClient.create(config)`. */
  constructor(token, nativeClient) {
    if (token !== CONSTRUCT) {
      throw new TypeError("construct a client with `await ProsodyClient.create(config)`");
    }
    this.#native = nativeClient;
  }

  /** Creates a client; the configuration falls back to PROSODY_* environment variables. */
  static async create(config = {}) {
    if (config === null || typeof config !== "object" || Array.isArray(config)) {
      throw new TypeError("ProsodyClient.create expects a configuration object");
    }
    const text = JSON.stringify(config);
    const nativeClient = await call(() => native.createClient(text));
    return new ProsodyClient(CONSTRUCT, nativeClient);
  }

  /** The `source-system` header stamped on sent messages. */
  get sourceSystem() {
    return this.#native.sourceSystem;
  }

  /** Sends a JSON payload to `topic` under `key`. */
  async send(topic, key, payload, signal) {
    const text = JSON.stringify(payload);
    if (text === undefined) throw new TypeError("the payload must be a JSON-compatible value");
    return withSignal(signal, (token) => this.#native.send(String(topic), String(key), text, token));
  }

  /** Sends an excise record (the key with no payload) to `topic`. */
  async excise(topic, key, signal) {
    return withSignal(signal, (token) => this.#native.excise(String(topic), String(key), token));
  }

  /** Starts consuming with a handler that defines onMessage, onExcise and onTimer. */
  async subscribe(eventHandler) {
    if (eventHandler === null || (typeof eventHandler !== "object" && typeof eventHandler !== "function")) {
      throw new TypeError("subscribe expects an event handler object with onMessage, onExcise and onTimer");
    }
    const missing = HANDLER_METHODS.filter((method) => typeof eventHandler[method] !== "function");
    if (missing.length > 0) {
      throw new TypeError(
        `the event handler is missing ${missing.join(", ")}: every handler must define onMessage, onExcise and onTimer`,
      );
    }
    await call(() => this.#native.subscribe(deliverer(eventHandler), abortAttempt));
  }

  /** Stops consuming; the client can subscribe again. */
  async unsubscribe() {
    await call(() => this.#native.unsubscribe());
  }

  /** Stops every client service. Concurrent and repeated calls await the same operation. */
  shutdown() {
    this.#shutdown ??= call(() => this.#native.shutdown());
    return this.#shutdown;
  }

  async consumerState() {
    return this.#native.consumerState();
  }

  async assignedPartitionCount() {
    return this.#native.assignedPartitionCount();
  }

  async isStalled() {
    return this.#native.isStalled();
  }

  /** Requests are not available in this build yet. */
  async request() {
    throw new PermanentError("requests are not available in this build of Prosody yet");
  }

  /** Excise requests are not available in this build yet. */
  async requestExcise() {
    throw new PermanentError("requests are not available in this build of Prosody yet");
  }

  /** Published state is not available in this build yet. */
  async state(subsystem, definition) {
    checkDefinition(definition);
    throw new PermanentStateError("published state is not available in this build of Prosody yet");
  }
}

class AdminClient {
  #native;

  /** An admin client for `bootstrapServers` (default: PROSODY_BOOTSTRAP_SERVERS). */
  constructor(bootstrapServers = process.env.PROSODY_BOOTSTRAP_SERVERS) {
    const servers = Array.isArray(bootstrapServers) ? bootstrapServers.join(",") : bootstrapServers;
    if (typeof servers !== "string" || servers.trim() === "") {
      throw new TypeError("AdminClient needs bootstrap servers (or PROSODY_BOOTSTRAP_SERVERS)");
    }
    try {
      this.#native = new native.NativeAdminClient(servers);
    } catch (error) {
      throw translate(error);
    }
  }

  async createTopic(name, partitions = 1, replicationFactor = 1) {
    await call(() => this.#native.createTopic(String(name), partitions, replicationFactor));
  }

  async deleteTopic(name) {
    await call(() => this.#native.deleteTopic(String(name)));
  }
}

// ---------------------------------------------------------------------------------------------
// Keyed-state definitions: plain frozen data, validated by Rust when the client registers them.

const KINDS = new Set(["value", "map", "deque"]);
const PAYLOADS = new Set(["json", "message"]);

function checkDefinition(definition) {
  if (
    definition === null ||
    typeof definition !== "object" ||
    !KINDS.has(definition.kind) ||
    !PAYLOADS.has(definition.payload) ||
    typeof definition.name !== "string"
  ) {
    throw new TypeError("expected a keyed-state definition made by value(), map(), deque() or message*()");
  }
}

function define(kind, payload, name, options = {}) {
  if (typeof name !== "string" || name === "") throw new TypeError("a collection name must be a non-empty string");
  const definition = { name, kind, payload };
  for (const [option, value] of Object.entries(options)) {
    if (value !== undefined) definition[option] = value;
  }
  return Object.freeze(definition);
}

const value = (name, options) => define("value", "json", name, options);
const map = (name, options) => define("map", "json", name, options);
const deque = (name, options) => define("deque", "json", name, options);
const messageValue = (name, options) => define("value", "message", name, options);
const messageMap = (name, options) => define("map", "message", name, options);
const messageDeque = (name, options) => define("deque", "message", name, options);

// ---------------------------------------------------------------------------------------------
// Logging and telemetry

const LEVELS = ["error", "warn", "info", "debug", "trace"];

function writeStderr(level) {
  return (message) => process.stderr.write(`${new Date().toISOString()} ${level.toUpperCase()} ${message}\n`);
}

const defaultLogger = Object.freeze(Object.fromEntries(LEVELS.map((level) => [level, writeStderr(level)])));
let currentLogger;

function checkLogger(logger) {
  if (logger === null || typeof logger !== "object") throw new TypeError("a logger must be an object");
  const missing = LEVELS.filter((level) => typeof logger[level] !== "function");
  if (missing.length > 0) throw new TypeError(`the logger is missing ${missing.join(", ")}`);
}

/** Replaces the logger Prosody's Rust core logs to. */
function setLogger(logger) {
  checkLogger(logger);
  currentLogger = logger;
}

/** Sets the logger only when none was set; true when it was set. */
function setLoggerIfUnset(logger) {
  if (currentLogger !== undefined) return false;
  setLogger(logger);
  return true;
}

function loggerIsSet() {
  return currentLogger !== undefined;
}

function getCurrentLogger() {
  return currentLogger ?? defaultLogger;
}

function log(level, target, message) {
  const logger = getCurrentLogger();
  try {
    logger[LEVELS[level] ?? "info"](`${target}: ${message}`);
  } catch {
    // A failing logger must not break the Rust side.
  }
}

/** Prepares logging and tracing; called on load, safe to call again. */
function initialize() {
  native.setLogSink(log);
}

/**
 * Exports pending telemetry: the handler spans buffered for OTLP export (configured by the
 * standard OTEL_* environment variables; without an endpoint there is nothing to export).
 */
async function flushTelemetry() {
  await native.flushTelemetry();
}

/** Exports pending telemetry and stops span export; call it before the process exits. */
async function shutdownTelemetry() {
  await native.shutdownTelemetry();
}

initialize();

module.exports = {
  ProsodyClient,
  AdminClient,
  Context,
  ConsumerState,
  Mode,
  EventHandlerError,
  TransientError,
  PermanentError,
  TransientStateError,
  PermanentStateError,
  isStateError,
  transient,
  permanent,
  value,
  map,
  deque,
  messageValue,
  messageMap,
  messageDeque,
  setLogger,
  setLoggerIfUnset,
  loggerIsSet,
  getCurrentLogger,
  initialize,
  flushTelemetry,
  shutdownTelemetry,
};
