// Type test: compiled by `tsc --noEmit` (npm run typecheck). Lines marked @ts-expect-error must
// fail to type-check; everything else must pass.
import {
  AdminClient,
  type Configuration,
  ConsumerState,
  type Context,
  type EventHandler,
  type JsonCompatible,
  type JsonValue,
  type Message,
  Mode,
  type Outcome,
  PermanentError,
  ProsodyClient,
  TransientError,
  deque,
  getCurrentLogger,
  isStateError,
  map,
  messageDeque,
  permanent,
  setLogger,
  transient,
  value,
} from "@prosody-events/prosody";

interface Activity {
  type: "activity";
  user: string;
  at: string;
  tags: string[];
}

const COUNT = value<number>("count", { ttlSeconds: 30 * 24 * 60 * 60 });
const PENDING = messageDeque<Activity>("pending", { capacity: 100, ttlSeconds: 86_400 });
const TAGS = map<string[]>("tags", { keysetLimit: 256 });
const LOG = deque("log");

async function typed(): Promise<void> {
  const config: Configuration = {
    groupId: "g",
    subscribedTopics: ["a", "b"],
    mode: Mode.LowLatency,
    failureTopic: "dead",
    probePort: null,
    timeoutMs: "30s",
    stateCollections: [COUNT, PENDING, TAGS, LOG],
  };
  const client = await ProsodyClient.create(config);
  const state: ConsumerState = await client.consumerState();
  const partitions: number = await client.assignedPartitionCount();
  const stalled: boolean = await client.isStalled();
  const source: string = client.sourceSystem;
  void [state, partitions, stalled, source];

  const activity: Activity = { type: "activity", user: "u", at: "now", tags: [] };
  await client.send("topic", "key", activity);
  await client.send("topic", "key", { nested: { list: [1, "two", null, true] } });
  await client.send("topic", "key", 42, new AbortController().signal);
  // @ts-expect-error Date is not JSON-compatible
  await client.send("topic", "key", { at: new Date() });
  // @ts-expect-error functions are not JSON-compatible
  await client.send("topic", "key", { run: () => 1 });
  // @ts-expect-error bigint is not JSON-compatible
  await client.send("topic", "key", { big: 1n });
  await client.excise("topic", "key", AbortSignal.timeout(1000));

  const handler = {
    async onMessage(context: Context, message: Message<Activity>, signal: AbortSignal) {
      const count = context.state(COUNT);
      await count.set(((await count.get()) ?? 0) + 1);
      const pending = context.state(PENDING);
      await pending.push(message);
      for await (const saved of pending.values()) {
        const user: string = saved.payload.user;
        void user;
      }
      const tags = context.state(TAGS);
      for await (const [entry, list] of tags.entries("backward")) {
        void [entry.toUpperCase(), list.length];
      }
      await context.clearAndSchedule(new Date(Date.now() + 60_000));
      const times: Date[] = await context.scheduled();
      if (context.shouldCancel || signal.aborted) await context.onCancel();
      return times.length > 0 ? { scheduled: times.length } : null;
    },
    async onExcise(context: Context) {
      await context.state(COUNT).clear();
      await context.clearScheduled();
      return null;
    },
    async onTimer(context: Context, timer: { key: string; time: Date }) {
      await context.unschedule(timer.time);
    },
  } satisfies EventHandler<Activity, { scheduled: number } | null>;
  await client.subscribe(handler);

  // @ts-expect-error onTimer is required
  await client.subscribe({ onMessage: async () => null, onExcise: async () => null });

  // @ts-expect-error the response must be JSON-compatible
  await client.subscribe<JsonValue, Date>({ onMessage: async () => new Date(), onExcise: async () => new Date(), onTimer: async () => {} });

  const results = await client.request<{ accepted: string }>("orders", "o-1", { type: "order.created" }, { subsystems: ["inventory"], timeoutMs: 2000 });
  for (const [subsystem, outcome] of results) {
    const o: Outcome<{ accepted: string }> = outcome;
    if (o.ok) console.log(subsystem, o.value.accepted);
    else console.error(subsystem, o.error.message);
  }
  const reader = await client.state("checkout", COUNT);
  const current: number | undefined = await reader.get("customer-1");
  void current;

  await client.unsubscribe();
  await client.shutdown();

  const admin = new AdminClient("localhost:9092");
  await admin.createTopic("t", 4, 1);
  await admin.deleteTopic("t");

  setLogger({ error() {}, warn() {}, info() {}, debug() {}, trace() {} });
  getCurrentLogger().info("hello");
}

// Decorators (TC39, TypeScript 5 default).
class Decorated {
  @permanent(TypeError, RangeError)
  async onMessage(_context: Context, _message: Message) {
    return null;
  }

  @transient(SyntaxError)
  async onExcise() {
    return null;
  }

  async onTimer() {}
}
const decoratedHandler: EventHandler = new Decorated();
void decoratedHandler;

function classify(error: unknown): boolean {
  if (isStateError(error)) return error.isPermanent;
  if (error instanceof PermanentError) return error.isPermanent satisfies true;
  if (error instanceof TransientError) return error.isPermanent satisfies false;
  return false;
}

type Checked = JsonCompatible<{ a: number; b: { c: string[] } }>;
const checked: Checked = { a: 1, b: { c: ["x"] } };
void [typed, classify, checked];
