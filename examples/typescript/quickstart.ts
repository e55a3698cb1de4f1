// A typed handler: payload and response types flow through EventHandler<P, R>.
// Type-checked by `npm run typecheck` in crates/node-binding (scripts/test runs it).
// Run: build the addon, then `npx tsc -p examples/typescript && node examples/typescript/dist/quickstart.js`.
import {
  type Context,
  type EventHandler,
  type ExciseMessage,
  type Message,
  type Timer,
  PermanentError,
  ProsodyClient,
  permanent,
} from "@prosody-events/prosody";

interface OrderPlaced {
  type: "order.placed";
  orderId: string;
  items: { sku: string; quantity: number }[];
  note?: string;
}

interface Accepted {
  accepted: string;
  items: number;
}

class ValidationError extends Error {}

class OrderHandler implements EventHandler<OrderPlaced, Accepted | null> {
  readonly seen: string[] = [];

  @permanent(ValidationError)
  async onMessage(context: Context, message: Message<OrderPlaced>, signal: AbortSignal): Promise<Accepted> {
    if (message.payload.items.length === 0) throw new ValidationError("an order needs items");
    if (signal.aborted || context.shouldCancel) throw new PermanentError("cancelled");
    this.seen.push(message.payload.orderId);
    return { accepted: message.key, items: message.payload.items.length };
  }

  async onExcise(_context: Context, message: ExciseMessage): Promise<null> {
    this.seen.push(`excised ${message.key}`);
    return null;
  }

  async onTimer(_context: Context, timer: Timer): Promise<void> {
    console.log(`timer ${timer.key} at ${timer.time.toISOString()}`);
  }
}

export async function main(): Promise<void> {
  const client = await ProsodyClient.create({ mock: true, groupId: "orders", subscribedTopics: "orders", probePort: null });
  const handler = new OrderHandler();
  await client.subscribe(handler);
  const order: OrderPlaced = { type: "order.placed", orderId: "o-1", items: [{ sku: "book", quantity: 1 }] };
  await client.send("orders", "customer-1", order);
  await client.excise("orders", "customer-2");
  await client.shutdown();
  console.log(handler.seen);
}

if (require.main === module) {
  main().catch((error: unknown) => {
    console.error(error);
    process.exitCode = 1;
  });
}
