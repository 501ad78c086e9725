// An agent for server.mjs on the official TypeScript SDK's v2 client, for
// account acme (the X-Account header). It calls create_invoice: once,
// again with the same key, with a changed argument under that key, without
// a key, and without an account; it prints the five results as one JSON
// object.
//
//   node client.mjs http://127.0.0.1:8090/mcp
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { mintKey } from '@idemledger/guard';

const url = new URL(process.argv[2]);
const connect = async (headers) => {
  const client = new Client({ name: 'ts-agent', version: '1.0.0' }, { versionNegotiation: { mode: 'auto' } });
  await client.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers } }));
  return client;
};
const client = await connect({ 'X-Account': 'acme' });
const anonymous = await connect({});

const key = mintKey(); // one key per intent, reused on every retry
const args = { customer: 'cus_ts', currency: 'EUR', amount_cents: 4200 };
const call = (c, a) => c.callTool({ name: 'create_invoice', arguments: a });
const out = {
  first: await call(client, { ...args, idempotency_key: key }),
  retry: await call(client, { amount_cents: 4200, currency: 'EUR', customer: 'cus_ts', idempotency_key: key }),
  changed: await call(client, { ...args, amount_cents: 4300, idempotency_key: key }),
  noKey: await call(client, args),
  noAccount: await call(anonymous, { ...args, idempotency_key: mintKey() }),
};
console.log(JSON.stringify(out));
await Promise.all([client.close(), anonymous.close()]);
