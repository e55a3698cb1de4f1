// OpenTelemetry export from the Node.js package: handler spans go to the OTLP/HTTP endpoint the
// standard variables name, and flushTelemetry() sends them before the batch delay would.
"use strict";

const { test } = require("node:test");
const assert = require("node:assert/strict");
const http = require("node:http");
const path = require("node:path");
const { spawn } = require("node:child_process");

/** An OTLP/HTTP collector stand-in that keeps every request body it receives. */
async function collector() {
  const requests = [];
  const server = http.createServer((request, response) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      requests.push({ url: request.url, body: Buffer.concat(chunks) });
      response.writeHead(200, { "content-type": "application/x-protobuf" });
      response.end();
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { requests, server, endpoint: `http://127.0.0.1:${server.address().port}` };
}

test("handler spans are exported over OTLP, and flushTelemetry() exports them at once", async () => {
  const { requests, server, endpoint } = await collector();
  const child = spawn(process.execPath, [path.join(__dirname, "fixtures", "otlp-child.js")], {
    env: {
      ...process.env,
      OTEL_EXPORTER_OTLP_ENDPOINT: endpoint,
      OTEL_SERVICE_NAME: "prosody-otlp-test",
      // Ten minutes: only an explicit flush can export within this test.
      OTEL_BSP_SCHEDULE_DELAY: "600000",
    },
    stdio: ["pipe", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stderr.on("data", (chunk) => {
    stderr += chunk;
  });
  const exited = new Promise((resolve) => child.on("exit", resolve));
  try {
    await new Promise((resolve, reject) => {
      child.stdout.on("data", (chunk) => {
        stdout += chunk;
        if (stdout.includes("flushed\n")) resolve();
      });
      exited.then((code) => reject(new Error(`child exited (${code}) before flushing: ${stderr}`)));
    });
    const traces = requests.filter((request) => request.url === "/v1/traces");
    assert.ok(traces.length >= 1, `no OTLP trace export after flushTelemetry(): ${JSON.stringify(requests.map((r) => r.url))}`);
    // The protobuf body carries span names and resource attributes as plain bytes.
    const body = Buffer.concat(traces.map((request) => request.body)).toString("latin1");
    assert.ok(body.includes("prosody.handle"), "the handler span is exported");
    assert.ok(body.includes("traced-key"), "with the message key");
    assert.ok(body.includes("prosody-otlp-test"), "under OTEL_SERVICE_NAME");
  } finally {
    child.stdin.end();
    const code = await exited;
    server.close();
    assert.equal(code, 0, `child failed: ${stderr}`);
  }
});
