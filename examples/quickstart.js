const { ProsodyClient } = require("../crates/node-binding");

async function main() {
  // Initialize the client with Kafka bootstrap servers, consumer group, and topics
  const client = await ProsodyClient.create({
    // Bootstrap servers should normally be set using the PROSODY_BOOTSTRAP_SERVERS environment variable
    bootstrapServers: "localhost:9092",

    // To allow loopbacks, sourceSystem must be different from groupId.
    // Normally, sourceSystem is omitted and defaults to groupId.
    sourceSystem: "my-application-source",

    // groupId should be set to the name of your application
    groupId: "my-consumer-group",

    // Topics the client should subscribe to
    subscribedTopics: "my-topic",

    mock: true,
  });

  // Define a message handler
  const messageHandler = {
    onExcise: async (context, message, signal) => {
      console.log(`Excise key: ${message.key}`);
      await context.clearScheduled();
      return null;
    },

    onMessage: async (context, message, signal) => {
      // Process the received message
      console.log(`Received message: ${JSON.stringify(message)}`);

      // Schedule a timer for delayed processing
      if (message.payload.scheduleFollowup) {
        const followupTime = new Date(Date.now() + 30000); // 30 seconds from now
        await context.schedule(followupTime);
      }
      return null;
    },

    onTimer: async (context, timer, signal) => {
      // Handle timer firing
      console.log(`Timer fired for key: ${timer.key} at ${timer.time}`);
    },
  };

  // Subscribe to messages using the message handler
  await client.subscribe(messageHandler);

  // Send a message to a topic
  await client.send("my-topic", "message-key", { content: "Hello, Kafka!" });
  await client.excise("my-topic", "obsolete-key");

  // Shut down all client services when done
  await client.shutdown();
}

main().catch(console.error);
