// An agent on the official TypeScript MCP SDK's client that sends its
// idempotency key as MCP SEP-3182's idempotencyKey parameter of tools/call
// (the SDK sends params as given). It calls create_invoice on the server at
// the URL it is given: once, again with the same key, with a changed
// argument under that key; then with a key argument and another parameter
// (the argument wins), and with that other parameter alone. It prints the
// server's experimental capabilities and the five results as one JSON
// object.
//
//   node sep3182.mjs http://127.0.0.1:8090/mcp
import { randomUUID } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

const url = new URL(process.argv[2]);
const client = new Client({ name: 'ts-agent-sep3182', version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(url));

const key = `ts-${randomUUID()}`;
const other = `ts-${randomUUID()}`;
const args = { customer: 'cus_ts', currency: 'EUR', amount_cents: 4200 };
const call = (a, idempotencyKey) =>
  client.request({ method: 'tools/call', params: { name: 'create_invoice', arguments: a, idempotencyKey } }, CallToolResultSchema);
const out = {
  experimental: client.getServerCapabilities()?.experimental ?? {},
  first: await call(args, key),
  retry: await call(args, key),
  changed: await call({ ...args, amount_cents: 4300 }, key),
  argumentWins: await call({ ...args, idempotency_key: key }, other),
  paramOnly: await call(args, other),
};
console.log(JSON.stringify(out));
await client.close();
