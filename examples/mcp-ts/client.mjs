// An agent on the official TypeScript MCP SDK's client. It calls
// create_invoice on the server at the URL it is given: once, again with the
// same key, with a changed argument under that key, and without a key.
// It prints the four results as one JSON object.
//
//   node client.mjs http://127.0.0.1:8090/mcp
import { randomUUID } from 'node:crypto';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const KEY_META = 'io.idemledger/idempotency-key';
const url = new URL(process.argv[2]);
const client = new Client({ name: 'ts-agent', version: '1.0.0' });
await client.connect(new StreamableHTTPClientTransport(url));

const key = `ts-${randomUUID()}`;
const args = { customer: 'cus_ts', currency: 'EUR', amount_cents: 4200 };
const call = (a, meta) => client.callTool({ name: 'create_invoice', arguments: a, ...(meta ? { _meta: meta } : {}) });
const out = {
  first: await call(args, { [KEY_META]: key }),
  retry: await call({ amount_cents: 4200, currency: 'EUR', customer: 'cus_ts' }, { [KEY_META]: key }),
  changed: await call({ ...args, amount_cents: 4300 }, { [KEY_META]: key }),
  noKey: await call(args),
};
console.log(JSON.stringify(out));
await client.close();
