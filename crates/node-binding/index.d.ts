// TypeScript declarations of @prosody-events/prosody 0.5.1.

// ---------------------------------------------------------------------------------------------
// Payload types

/** A JSON null, boolean, number, or string. */
export type JsonPrimitive = null | boolean | number | string;

/** Any recursively JSON-compatible value. */
export type JsonValue = JsonPrimitive | JsonValue[] | { [key: string]: JsonValue };

/** A value or a promise-like value. */
export type MaybePromise<T> = T | PromiseLike<T>;

type NonJson = undefined | bigint | symbol | Date | ((...args: never[]) => unknown);

/**
 * Rejects non-JSON members in a known application type: functions, `undefined`, `Date`,
 * symbols, bigints and invalid nested fields become `never`, so ordinary interfaces pass and
 * mistakes are reported before serialization.
 */
export type JsonCompatible<T> = unknown extends T
  ? T
  : T extends NonJson
    ? never
    : T extends JsonPrimitive
      ? T
      : T extends readonly (infer U)[]
        ? readonly JsonCompatible<U>[]
        : T extends object
          ? { [K in keyof T]: K extends string ? JsonCompatible<T[K]> : never }
          : never;

// ---------------------------------------------------------------------------------------------
// Records

/** A Kafka message given to `onMessage`. */
export interface Message<P = JsonValue> {
  readonly topic: string;
  readonly partition: number;
  readonly offset: number;
  readonly timestamp: Date;
  readonly key: string;
  readonly payload: P;
}

/** An excise record given to `onExcise`: a key whose data must be deleted. No payload. */
export interface ExciseMessage {
  readonly topic: string;
  readonly partition: number;
  readonly offset: number;
  readonly timestamp: Date;
  readonly key: string;
}

/** A timer that fired, given to `onTimer`. */
export interface Timer {
  /** The entity key identifying what this timer belongs to. */
  readonly key: string;
  /** The time when this timer was scheduled to fire. */
  readonly time: Date;
}

// ---------------------------------------------------------------------------------------------
// Keyed state

export type ScanDirection = "forward" | "backward";

export interface StateDefinitionOptions {
  ttlSeconds?: number;
  readUncommitted?: boolean;
}

export interface ReadCacheOptions {
  ttlMs: number;
}

export interface PublishedStateDefinitionOptions extends StateDefinitionOptions {
  published?: boolean;
  readCache?: ReadCacheOptions | false;
}

export interface MapDefinitionOptions extends PublishedStateDefinitionOptions {
  keysetLimit?: number;
}

export interface DequeDefinitionOptions extends PublishedStateDefinitionOptions {
  capacity?: number;
}

export interface MessageMapDefinitionOptions extends StateDefinitionOptions {
  keysetLimit?: number;
}

export interface MessageDequeDefinitionOptions extends StateDefinitionOptions {
  capacity?: number;
}

interface DefinitionBase<K extends "value" | "map" | "deque", Payload extends "json" | "message"> {
  readonly name: string;
  readonly kind: K;
  readonly payload: Payload;
  readonly ttlSeconds?: number;
  readonly readUncommitted?: boolean;
}

interface JsonDefinitionBase<K extends "value" | "map" | "deque"> extends DefinitionBase<K, "json"> {
  readonly published?: boolean;
  readonly readCache?: ReadCacheOptions | false;
}

declare const itemType: unique symbol;

export interface ValueDefinition<T = JsonValue> extends JsonDefinitionBase<"value"> {
  readonly [itemType]?: T;
}
export interface MapDefinition<V = JsonValue> extends JsonDefinitionBase<"map"> {
  readonly keysetLimit?: number;
  readonly [itemType]?: V;
}
export interface DequeDefinition<T = JsonValue> extends JsonDefinitionBase<"deque"> {
  readonly capacity?: number;
  readonly [itemType]?: T;
}
export interface MessageValueDefinition<P = JsonValue> extends DefinitionBase<"value", "message"> {
  readonly [itemType]?: Message<P>;
}
export interface MessageMapDefinition<P = JsonValue> extends DefinitionBase<"map", "message"> {
  readonly keysetLimit?: number;
  readonly [itemType]?: Message<P>;
}
export interface MessageDequeDefinition<P = JsonValue> extends DefinitionBase<"deque", "message"> {
  readonly capacity?: number;
  readonly [itemType]?: Message<P>;
}

/** One `stateCollections` entry; make it with a definition constructor. */
export interface StateCollectionConfig {
  readonly name: string;
  readonly kind: "value" | "map" | "deque";
  readonly payload: "json" | "message";
  readonly ttlSeconds?: number;
  readonly readUncommitted?: boolean;
  readonly published?: boolean;
  readonly keysetLimit?: number;
  readonly capacity?: number;
}

export function value<T = JsonValue>(name: string, options?: PublishedStateDefinitionOptions): ValueDefinition<T>;
export function map<V = JsonValue>(name: string, options?: MapDefinitionOptions): MapDefinition<V>;
export function deque<T = JsonValue>(name: string, options?: DequeDefinitionOptions): DequeDefinition<T>;
export function messageValue<P = JsonValue>(name: string, options?: StateDefinitionOptions): MessageValueDefinition<P>;
export function messageMap<P = JsonValue>(name: string, options?: MessageMapDefinitionOptions): MessageMapDefinition<P>;
export function messageDeque<P = JsonValue>(
  name: string,
  options?: MessageDequeDefinitionOptions,
): MessageDequeDefinition<P>;

interface StagedCollection {
  /** Makes this collection's pending writes durable now. */
  commit(): Promise<void>;
  /** Drops this collection's pending writes since its last commit. */
  rollback(): Promise<void>;
}

/** One value. `undefined` means absent; `null`/`undefined` cannot be stored (use `clear()`). */
export interface ValueState<T> extends StagedCollection {
  get(): Promise<T | undefined>;
  set(value: T): Promise<void>;
  clear(): Promise<void>;
}

/**
 * A string-keyed ordered map. Scans are lazy and chunked, in key order (`"forward"`, the
 * default) or reverse; a `for await` loop may stop early.
 */
export interface MapState<V> extends StagedCollection {
  get(key: string): Promise<V | undefined>;
  getMany(keys: readonly string[]): Promise<(V | undefined)[]>;
  has(key: string): Promise<boolean>;
  set(key: string, value: V): Promise<void>;
  delete(key: string): Promise<boolean>;
  clear(): Promise<void>;
  entries(direction?: ScanDirection): AsyncIterableIterator<[string, V]>;
  keys(direction?: ScanDirection): AsyncIterableIterator<string>;
  values(direction?: ScanDirection): AsyncIterableIterator<V>;
}

/** A double-ended queue; with a `capacity`, a push onto a full deque drops the oldest item. */
export interface DequeState<T> extends StagedCollection {
  push(item: T): Promise<void>;
  unshift(item: T): Promise<void>;
  pop(): Promise<T | undefined>;
  shift(): Promise<T | undefined>;
  at(index: number): Promise<T | undefined>;
  length(): Promise<number>;
  isEmpty(): Promise<boolean>;
  values(direction?: ScanDirection): AsyncIterableIterator<T>;
  clear(): Promise<void>;
}

export interface PublishedValue<T> {
  get(key: string): Promise<T | undefined>;
}

export interface PublishedMap<V> {
  get(key: string, entry: string): Promise<V | undefined>;
  getMany(key: string, entries: readonly string[]): Promise<(V | undefined)[]>;
  has(key: string, entry: string): Promise<boolean>;
  entries(key: string, direction?: ScanDirection): AsyncIterableIterator<[string, V]>;
  keys(key: string, direction?: ScanDirection): AsyncIterableIterator<string>;
  values(key: string, direction?: ScanDirection): AsyncIterableIterator<V>;
}

export interface PublishedDeque<T> {
  at(key: string, index: number): Promise<T | undefined>;
  length(key: string): Promise<number>;
  isEmpty(key: string): Promise<boolean>;
  values(key: string, direction?: ScanDirection): AsyncIterableIterator<T>;
}

// ---------------------------------------------------------------------------------------------
// Context and handlers

/** The current event context: timers of the current key, cancellation, keyed state. */
export interface Context {
  /** Resolves when the context is cancelled (timeout, rebalance, shutdown). */
  onCancel(): Promise<void>;
  /** Whether the context has been cancelled. */
  readonly shouldCancel: boolean;

  /** Schedules a timer for the current key (one-second precision; an upsert). */
  schedule(time: Date): Promise<void>;
  /** Replaces every timer of the current key with one at `time`. */
  clearAndSchedule(time: Date): Promise<void>;
  /** Removes the timer at `time`. */
  unschedule(time: Date): Promise<void>;
  /** Removes every timer of the current key. */
  clearScheduled(): Promise<void>;
  /** The scheduled times of the current key, ascending. */
  scheduled(): Promise<Date[]>;

  /**
   * Binds a registered collection for the current attempt. The handle (and its iterators) is
   * valid until the handler settles; later use rejects with a `TransientStateError`. Throws a
   * `PermanentStateError` when the name is not registered or is registered with another kind
   * or payload.
   */
  state<T>(definition: ValueDefinition<T>): ValueState<T>;
  state<V>(definition: MapDefinition<V>): MapState<V>;
  state<T>(definition: DequeDefinition<T>): DequeState<T>;
  state<P>(definition: MessageValueDefinition<P>): ValueState<Message<P>>;
  state<P>(definition: MessageMapDefinition<P>): MapState<Message<P>>;
  state<P>(definition: MessageDequeDefinition<P>): DequeState<Message<P>>;
}

/**
 * What `onMessage`/`onExcise` return: `MaybePromise<R & JsonCompatible<R>>`, written so that
 * `subscribe` infers `R` from the promise's value rather than from the promise itself.
 */
type HandlerResult<R> = PromiseLike<R & JsonCompatible<R>> | NoInfer<R & JsonCompatible<R>>;

/** Handles messages, excise records and timers. All three methods are required. */
export interface EventHandler<P = JsonValue, R = JsonValue> {
  onMessage(context: Context, message: Message<P>, signal: AbortSignal): HandlerResult<R>;
  onExcise(context: Context, message: ExciseMessage, signal: AbortSignal): HandlerResult<R>;
  onTimer(context: Context, timer: Timer, signal: AbortSignal): MaybePromise<void>;
}

// ---------------------------------------------------------------------------------------------
// Errors

/** Base class of handler errors. */
export abstract class EventHandlerError extends Error {
  abstract readonly isPermanent: boolean;
  /** Set on errors that come from the Rust core, e.g. `ERR_PROSODY_PRODUCER`. */
  code?: string;
}

/** Marks an error as retriable. */
export class TransientError extends EventHandlerError {
  readonly isPermanent: false;
}

/** Marks an error as final: the event is not retried. */
export class PermanentError extends EventHandlerError {
  readonly isPermanent: true;
}

/** A keyed-state error that Prosody can retry. */
export class TransientStateError extends TransientError {}

/** A keyed-state error that another attempt cannot resolve. */
export class PermanentStateError extends PermanentError {}

export function isStateError(error: unknown): error is PermanentStateError | TransientStateError;

type ErrorType = abstract new (...args: any[]) => unknown;

/** A decorator for handler methods or handler classes (TC39 or legacy `experimentalDecorators`). */
export interface ErrorClassDecorator {
  <F extends (...args: any[]) => any>(value: F, context: ClassMethodDecoratorContext): F;
  <C extends abstract new (...args: any[]) => unknown>(value: C, context: ClassDecoratorContext): C;
  <T>(
    target: object,
    propertyKey: string | symbol,
    descriptor: TypedPropertyDescriptor<T>,
  ): TypedPropertyDescriptor<T> | void;
  <F extends (...args: any[]) => any>(value: F): F;
}

/** Classifies the listed error types thrown by the decorated handler as transient. */
export function transient(...errorTypes: ErrorType[]): ErrorClassDecorator;

/** Classifies the listed error types thrown by the decorated handler as permanent. */
export function permanent(...errorTypes: ErrorType[]): ErrorClassDecorator;

// ---------------------------------------------------------------------------------------------
// Configuration

/** Selects the client processing mode. */
export declare const Mode: {
  readonly Pipeline: "pipeline";
  readonly LowLatency: "low-latency";
  readonly BestEffort: "best-effort";
};
export type Mode = (typeof Mode)[keyof typeof Mode];

/** Identifies the consumer lifecycle state. */
export declare const ConsumerState: {
  readonly Unconfigured: "unconfigured";
  readonly Configured: "configured";
  readonly Running: "running";
  readonly ShutDown: "shutdown";
};
export type ConsumerState = (typeof ConsumerState)[keyof typeof ConsumerState];

/** Configures the default published-state cache. */
export type ReadCacheConfiguration = ReadCacheOptions | number | string | boolean | null;

/** A duration: milliseconds (or seconds for `...S`/`...Seconds` options), or a string like `"30s"`. */
type Duration = number | string;

/**
 * Client settings. Unset options fall back to `PROSODY_*` environment variables, then to the
 * library defaults. Invalid values reject `ProsodyClient.create` with the option's name.
 */
export interface Configuration {
  bootstrapServers?: string | string[];
  groupId?: string;
  subscribedTopics?: string | string[];
  allowedEvents?: string | string[];
  sourceSystem?: string;
  subsystem?: string;
  mock?: boolean;
  mode?: Mode;
  sendTimeoutMs?: Duration;

  maxConcurrency?: number;
  maxUncommitted?: number;
  timeoutMs?: Duration;
  commitIntervalMs?: Duration;
  /** How often Kafka is polled; also the longest a broker holds a fetch for new records (at most 500 ms). */
  pollIntervalMs?: Duration;
  shutdownTimeoutMs?: Duration;
  stallThresholdMs?: Duration;
  /** HTTP port of the probe server; `null` or `"none"` disables it. */
  probePort?: number | "none" | null;
  failureTopic?: string;
  maxRetries?: number;
  retryBaseMs?: Duration;
  maxRetryDelayMs?: Duration;

  /** Entries of the process-wide dedup cache in front of a Cassandra or RocksDB store (at least 1; the memory store is asked directly). */
  idempotenceCacheSize?: number;
  idempotenceVersion?: string;
  idempotenceTtlS?: Duration;
  slabSizeMs?: Duration;
  messageSpans?: "child" | "follows_from";
  timerSpans?: "child" | "follows_from";

  deferEnabled?: boolean;
  deferBaseMs?: Duration;
  deferMaxDelayMs?: Duration;
  deferFailureThreshold?: number;
  deferFailureWindowMs?: Duration;
  deferStoreCacheSize?: number;
  loaderCacheSize?: number;
  loaderSeekTimeoutMs?: Duration;
  loaderDiscardThreshold?: number;
  /** 0.5.1 name of `loaderCacheSize`. */
  deferCacheSize?: number;
  /** 0.5.1 name of `loaderSeekTimeoutMs`. */
  deferSeekTimeoutMs?: Duration;
  /** 0.5.1 name of `loaderDiscardThreshold`. */
  deferDiscardThreshold?: number;

  monopolizationEnabled?: boolean;
  monopolizationThreshold?: number;
  monopolizationWindowMs?: Duration;
  monopolizationCacheSize?: number;

  schedulerFailureWeight?: number;
  schedulerMaxWaitMs?: Duration;
  schedulerWaitWeight?: number;
  schedulerCacheSize?: number;

  telemetryEnabled?: boolean;
  telemetryTopic?: string;

  cassandraNodes?: string | string[];
  cassandraKeyspace?: string;
  cassandraUser?: string;
  cassandraPassword?: string;
  cassandraDatacenter?: string;
  cassandraRack?: string;
  cassandraRetentionSeconds?: Duration;

  storageBackend?: "memory" | "rocksdb" | "cassandra";
  stateCollections?: readonly StateCollectionConfig[];
  stateCacheDir?: string;
  stateOwnedCacheSize?: number;
  /** 0.5.1 name of `stateOwnedCacheSize`. */
  stateCacheSizeBytes?: number;
  stateReadCacheSize?: number;
  stateReadCache?: ReadCacheConfiguration;
  stateRecoveryDelaySeconds?: Duration;
}

// ---------------------------------------------------------------------------------------------
// Requests

export interface RequestOptions {
  subsystems: readonly string[];
  timeoutMs: number;
  signal?: AbortSignal;
}

/** A handler, timeout, format-mismatch, or malformed-response error. */
export interface ResponseError {
  readonly kind: "handler" | "timeout" | "format-mismatch" | "malformed-response";
  readonly message: string;
}

export interface Success<T> {
  readonly ok: true;
  readonly value: T;
}

export interface Failure {
  readonly ok: false;
  readonly error: ResponseError;
}

export type Outcome<T> = Success<T> | Failure;

// ---------------------------------------------------------------------------------------------
// Clients

export class ProsodyClient {
  private constructor();

  /** Initialize a client without blocking the Node.js event loop. */
  static create(config?: Configuration): Promise<ProsodyClient>;

  /** The source system identifier stamped on sent messages. */
  readonly sourceSystem: string;

  /** Send a statically checked JSON-compatible message. */
  send<P>(topic: string, key: string, payload: P & JsonCompatible<P>, signal?: AbortSignal): Promise<void>;

  /** Send an excise record for a key. */
  excise(topic: string, key: string, signal?: AbortSignal): Promise<void>;

  /** Return one outcome for each subsystem. (Not available in this build yet: rejects.) */
  request<R = JsonValue>(
    topic: string,
    key: string,
    payload: JsonValue,
    options: RequestOptions,
  ): Promise<ReadonlyMap<string, Outcome<R>>>;

  /** Return one excise outcome for each subsystem. (Not available in this build yet: rejects.) */
  requestExcise<R = JsonValue>(
    topic: string,
    key: string,
    options: RequestOptions,
  ): Promise<ReadonlyMap<string, Outcome<R>>>;

  consumerState(): Promise<ConsumerState>;
  assignedPartitionCount(): Promise<number>;
  isStalled(): Promise<boolean>;

  /** Open a read-only published collection. (Not available in this build yet: rejects.) */
  state<T>(subsystem: string, definition: ValueDefinition<T>): Promise<PublishedValue<T>>;
  state<V>(subsystem: string, definition: MapDefinition<V>): Promise<PublishedMap<V>>;
  state<T>(subsystem: string, definition: DequeDefinition<T>): Promise<PublishedDeque<T>>;

  /** Subscribe with typed payload and response values. */
  subscribe<P = JsonValue, R = JsonValue>(eventHandler: EventHandler<P, R>): Promise<void>;

  /** Stop the consumer. You can subscribe again later. */
  unsubscribe(): Promise<void>;

  /** Stop all client services. Concurrent and repeated calls await the same operation. */
  shutdown(): Promise<void>;
}

export class AdminClient {
  /** An admin client for the given Kafka servers (default: `PROSODY_BOOTSTRAP_SERVERS`). */
  constructor(bootstrapServers?: string | string[]);
  createTopic(name: string, partitions?: number, replicationFactor?: number): Promise<void>;
  deleteTopic(name: string): Promise<void>;
}

// ---------------------------------------------------------------------------------------------
// Logging and telemetry

export interface Logger {
  error(message: string, ...rest: unknown[]): void;
  warn(message: string, ...rest: unknown[]): void;
  info(message: string, ...rest: unknown[]): void;
  debug(message: string, ...rest: unknown[]): void;
  trace(message: string, ...rest: unknown[]): void;
}

/** Prepare the logging and tracing system during application startup. */
export function initialize(): void;
/** Whether the application configured a logger. */
export function loggerIsSet(): boolean;
/** Replaces the logger. */
export function setLogger(logger: Logger): void;
/** Sets the logger only when no logger exists; true when it was set. */
export function setLoggerIfUnset(logger: Logger): boolean;
/** Returns the current JavaScript logger. */
export function getCurrentLogger(): Logger;
/** Exports pending telemetry. */
export function flushTelemetry(): Promise<void>;
/** Exports pending telemetry and stops its providers. */
export function shutdownTelemetry(): Promise<void>;
