// Type test of keyed state: compiled by `tsc --noEmit` (npm run typecheck). Lines marked with
// an expect-error directive must fail to type-check; everything else must pass.
import {
  type Context,
  type DequeState,
  type EventHandler,
  type MapState,
  type Message,
  PermanentStateError,
  ProsodyClient,
  type StateCollectionConfig,
  TransientStateError,
  type ValueState,
  deque,
  isStateError,
  map,
  messageDeque,
  messageMap,
  messageValue,
  value,
} from "@prosody-events/prosody";

interface Activity {
  user: string;
  action: string;
}

interface Summary {
  total: number;
  last: string | null;
}

const COUNT = value<number>("count", { ttlSeconds: 30 * 24 * 60 * 60 });
const WINDOW = value<boolean>("window", { ttlSeconds: 24 * 60 * 60 });
const PENDING = messageDeque<Activity>("pending", { capacity: 100, ttlSeconds: 24 * 60 * 60 });
const SUMMARIES = map<Summary>("summaries", { keysetLimit: 256, readUncommitted: true });
const RECENT = deque<string>("recent", { capacity: 10, published: true, readCache: { ttlMs: 500 } });
const LAST = messageValue<Activity>("last");
const BY_ACTION = messageMap<Activity>("by-action", { keysetLimit: 0 });

// Definitions expose their data, and are StateCollectionConfig entries.
const collections: StateCollectionConfig[] = [COUNT, WINDOW, PENDING, SUMMARIES, RECENT, LAST, BY_ACTION];
const capacity: number | undefined = PENDING.capacity;
const keysetLimit: number | undefined = SUMMARIES.keysetLimit;
const kind: "map" = SUMMARIES.kind;
const payload: "message" = LAST.payload;
void [collections, capacity, keysetLimit, kind, payload];

// @ts-expect-error message definitions take no publication options
messageValue("x", { published: true });
// @ts-expect-error capacity belongs to deques
value("x", { capacity: 3 });
// @ts-expect-error keysetLimit belongs to maps
deque("x", { keysetLimit: 3 });

declare function notify(key: string, messages: Message<Activity>[]): Promise<void>;

// The seed's five-minute window.
const windowed = {
  async onMessage(context: Context, message: Message<Activity>) {
    const window = context.state(WINDOW);
    const pending = context.state(PENDING);
    if (await window.get()) {
      await pending.push(message);
      return null;
    }
    await notify(message.key, [message]);
    await window.set(true);
    await context.clearAndSchedule(new Date(Date.now() + 5 * 60_000));
    return null;
  },
  async onTimer(context: Context, timer: { key: string; time: Date }) {
    const pending = context.state(PENDING);
    const messages: Message<Activity>[] = [];
    for await (const message of pending.values()) messages.push(message);
    if (messages.length > 0) await notify(timer.key, messages);
    await pending.clear();
    await context.state(WINDOW).clear();
  },
  async onExcise(context: Context) {
    await context.state(PENDING).clear();
    await context.state(WINDOW).clear();
    await context.clearScheduled();
    return null;
  },
} satisfies EventHandler<Activity>;

async function handles(context: Context, message: Message<Activity>): Promise<void> {
  const count: ValueState<number> = context.state(COUNT);
  const current: number | undefined = await count.get();
  await count.set((current ?? 0) + 1);
  // @ts-expect-error a number collection stores numbers
  await count.set("one");
  await count.commit();
  await count.rollback();

  const summaries: MapState<Summary> = context.state(SUMMARIES);
  await summaries.set(message.key, { total: 1, last: null });
  const one: Summary | undefined = await summaries.get("a");
  const many: (Summary | undefined)[] = await summaries.getMany(["a", "b"]);
  const present: boolean = await summaries.has("a");
  const removed: boolean = await summaries.delete("a");
  for await (const [entry, summary] of summaries.entries("backward")) {
    const total: number = summary.total;
    void [entry.length, total];
    break;
  }
  for await (const entry of summaries.keys()) void entry.toUpperCase();
  for await (const summary of summaries.values("forward")) void summary.last;
  // @ts-expect-error scan directions are "forward" or "backward"
  summaries.entries("sideways");
  // @ts-expect-error map keys are strings
  await summaries.get(1);
  void [one, many, present, removed];

  const recent: DequeState<string> = context.state(RECENT);
  await recent.push("x");
  await recent.unshift("w");
  const popped: string | undefined = await recent.pop();
  const shifted: string | undefined = await recent.shift();
  const at: string | undefined = await recent.at(-1);
  const length: number = await recent.length();
  const empty: boolean = await recent.isEmpty();
  const iterator: AsyncIterableIterator<string> = recent.values("backward");
  void [popped, shifted, at, length, empty, iterator];

  const last = context.state(LAST);
  await last.set(message);
  const previous: Message<Activity> | undefined = await last.get();
  const user: string | undefined = previous?.payload.user;
  const when: Date | undefined = previous?.timestamp;
  // @ts-expect-error message collections store messages
  await last.set({ user: "u", action: "a" });
  void [user, when];

  const byAction = context.state(BY_ACTION);
  await byAction.set(message.payload.action, message);
  for await (const [action, stored] of byAction.entries()) void [action, stored.offset];
}

async function errors(context: Context): Promise<boolean> {
  try {
    await context.state(COUNT).set(1);
    return true;
  } catch (error) {
    if (error instanceof PermanentStateError) return error.isPermanent satisfies true;
    if (error instanceof TransientStateError) return error.isPermanent satisfies false;
    if (isStateError(error)) {
      const narrowed: PermanentStateError | TransientStateError = error;
      return narrowed.isPermanent;
    }
    throw error;
  }
}

async function setup(): Promise<void> {
  const client = await ProsodyClient.create({ mock: true, stateCollections: [COUNT, WINDOW, PENDING] });
  await client.subscribe(windowed);
  await client.shutdown();
}

void [handles, errors, setup];
