// An agent on the official TypeScript SDK's v2 client
// (@modelcontextprotocol/client), for the interoperability tests. It
// connects to the Streamable HTTP endpoint it is given with the version
// negotiation it is told (auto: server/discover, then the 2025 handshake
// as a fallback; pin: 2026-07-28 or nothing; legacy: the 2025 handshake),
// and calls the tools of server-v2.mjs with idempotency keys in _meta:
//   - create_invoice, then its retry with the same key (and the arguments
//     in another order), then the same key with another amount; and once
//     more with its key in the tool's argument idempotency_key instead;
//   - charge, which asks for a confirmation first (answered yes by the
//     client), then its retry;
//   - count_writes, where the server has it.
// It prints what it saw as one JSON object: the era, each result, and how
// many times it was asked to confirm. Given stdio and a command instead of
// a URL, it runs the command as its server over stdio, as a host does.
//
//   node client-v2.mjs http://127.0.0.1:8091/mcp auto|pin|legacy [key-prefix]
//   node client-v2.mjs stdio auto|pin|legacy key-prefix -- idemproxy --config idemproxy.yaml --stdio
import { randomUUID } from 'node:crypto';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const KEY_META = 'io.idemledger/idempotency-key';
const argv = process.argv.slice(2);
const dashes = argv.indexOf('--');
const [url, mode = 'auto', prefix = `v2-${randomUUID()}`] = dashes < 0 ? argv : argv.slice(0, dashes);
const [command, ...args] = dashes < 0 ? [] : argv.slice(dashes + 1);
const negotiation = { auto: { mode: 'auto' }, pin: { mode: { pin: '2026-07-28' } }, legacy: undefined }[mode];
const client = new Client({ name: 'ts-v2-agent', version: '1.0.0' }, {
  capabilities: { elicitation: { form: {} } },
  ...(negotiation ? { versionNegotiation: negotiation } : {}),
});
let asked = 0;
client.setRequestHandler('elicitation/create', async () => {
  asked++;
  return { action: 'accept', content: { confirm: true } };
});
await client.connect(url === 'stdio'
  ? new StdioClientTransport({ command, args, env: process.env, stderr: 'inherit' })
  : new StreamableHTTPClientTransport(new URL(url)));

const call = (name, args, key) => client.callTool({ name, arguments: args, ...(key ? { _meta: { [KEY_META]: key } } : {}) });
const invoice = { customer: 'cus_v2', currency: 'EUR', amount_cents: 4200 };
const out = { era: client.getProtocolEra() };
out.first = await call('create_invoice', invoice, `${prefix}-invoice`);
out.retry = await call('create_invoice', { amount_cents: 4200, currency: 'EUR', customer: 'cus_v2' }, `${prefix}-invoice`);
out.changed = await call('create_invoice', { ...invoice, amount_cents: 4300 }, `${prefix}-invoice`);
out.argKey = await call('create_invoice', { ...invoice, idempotency_key: `${prefix}-arg` });
out.argKeyRetry = await call('create_invoice', { ...invoice, idempotency_key: `${prefix}-arg` });
out.charge = await call('charge', { customer: 'cus_v2', amount_cents: 990 }, `${prefix}-charge`);
out.chargeRetry = await call('charge', { customer: 'cus_v2', amount_cents: 990 }, `${prefix}-charge`);
out.asked = asked;
const { tools } = await client.listTools();
if (tools.some((t) => t.name === 'count_writes')) out.count = JSON.parse((await call('count_writes', {})).content[0].text);
console.log(JSON.stringify(out));
await client.close();
