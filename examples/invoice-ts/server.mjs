// An invoice MCP server on the official TypeScript SDK, its write tool
// guarded by @idemledger/guard: a retried create_invoice is done once per
// key, per account, and answered with the first result. It serves
// Streamable HTTP on 127.0.0.1 and prints "listening <port>".
//
//   LEDGER_URL=http://127.0.0.1:7071 LEDGER_TOKEN=… node server.mjs
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';
import { createLedger, Guard, keyShape, McpGuard } from '@idemledger/guard';

const ledger = createLedger({ baseUrl: process.env.LEDGER_URL ?? 'http://127.0.0.1:7071', token: process.env.LEDGER_TOKEN });
// One key space per account: the X-Account header of the call.
const guard = new McpGuard(new Guard(ledger), (_args, extra) => String(extra.requestInfo?.headers?.['x-account'] ?? 'acme'));
const invoices = [];

function server() {
  const s = new McpServer({ name: 'invoices', version: '1.0.0' });
  s.registerTool('create_invoice', {
    description: 'Create an invoice.',
    inputSchema: { customer: z.string(), currency: z.string(), amount_cents: z.number().int(), ...keyShape(z) },
  }, guard.tool('create_invoice', async ({ customer, currency, amount_cents }) => {
    const invoice = { id: `inv_${randomUUID()}`, customer, currency, amount_cents };
    invoices.push(invoice); // the write, once per key
    return { content: [{ type: 'text', text: JSON.stringify(invoice) }], structuredContent: invoice };
  }, { policy: { leaseMs: 30_000, onInProgress: 'wait' } }));
  s.registerTool('count_invoices', { description: 'How many invoices there are.' }, async () =>
    ({ content: [{ type: 'text', text: JSON.stringify({ invoices: invoices.length }) }] }));
  return s;
}

const httpServer = http.createServer(async (req, res) => {
  const s = server();
  const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
  res.on('close', () => { transport.close(); s.close(); });
  await s.connect(transport);
  await transport.handleRequest(req, res);
});
httpServer.listen(0, '127.0.0.1', () => console.log(`listening ${httpServer.address().port}`));
