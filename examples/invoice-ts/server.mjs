// An invoice MCP server on the official TypeScript SDK (v2:
// @modelcontextprotocol/server, served by @modelcontextprotocol/node), its
// write tool guarded by @idemledger/guard: a retried create_invoice is done
// once per key, per account, and answered with the first result, on the
// 2026-07-28 revision and on the 2025 ones alike. The account is the
// X-Account header of the call; a call without one is refused. It serves
// Streamable HTTP on 127.0.0.1 and prints "listening <port>".
//
//   LEDGER_URL=http://127.0.0.1:7072 LEDGER_TOKEN=… node server.mjs
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { createMcpHandler, McpServer } from '@modelcontextprotocol/server';
import { localhostHostValidation, localhostOriginValidation, toNodeHandler } from '@modelcontextprotocol/node';
import * as z from 'zod/v4';
import { createLedger, Guard, keyShape, McpGuard, tenantFromHeader } from '@idemledger/guard';

// ledgerd's HTTP listener (--http-listen, 7072 by default).
const ledger = createLedger({ baseUrl: process.env.LEDGER_URL ?? 'http://127.0.0.1:7072', token: process.env.LEDGER_TOKEN });
const guard = new McpGuard(new Guard(ledger), tenantFromHeader('X-Account'));
const invoices = [];

const handler = createMcpHandler(() => {
  const s = new McpServer({ name: 'invoices', version: '1.0.0' });
  s.registerTool('create_invoice', {
    description: 'Create an invoice.',
    inputSchema: z.object({ customer: z.string(), currency: z.string(), amount_cents: z.number().int(), ...keyShape(z) }),
  }, guard.tool('create_invoice', async ({ customer, currency, amount_cents }) => {
    const invoice = { id: `inv_${randomUUID()}`, customer, currency, amount_cents };
    invoices.push(invoice); // the write, once per key
    return { content: [{ type: 'text', text: JSON.stringify(invoice) }], structuredContent: invoice };
  }, { policy: { leaseMs: 30_000, onInProgress: 'wait' } }));
  s.registerTool('count_invoices', { description: 'How many invoices there are.' }, async () =>
    ({ content: [{ type: 'text', text: JSON.stringify({ invoices: invoices.length }) }] }));
  return s;
});

const serve = toNodeHandler(handler);
const validHost = localhostHostValidation();
const validOrigin = localhostOriginValidation();
const httpServer = http.createServer((req, res) => {
  if (validHost(req, res) && validOrigin(req, res)) void serve(req, res);
});
httpServer.listen(0, '127.0.0.1', () => console.log(`listening ${httpServer.address().port}`));
