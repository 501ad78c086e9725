// A small MCP server on the official TypeScript SDK's v2 packages
// (@modelcontextprotocol/server and /node), serving both eras from one
// factory: the 2026-07-28 revision (stateless, per-request _meta,
// input_required) and the 2025 revisions (initialize). Its write tools have
// no idempotency of their own:
//   - create_invoice appends an invoice row every time it runs;
//   - charge asks for a confirmation first (an input_required round on the
//     2026-07-28 revision, an elicitation on the 2025 ones), then appends a
//     charge row;
//   - big_report answers a text of the bytes it is asked for;
//   - count_writes says how many rows there are, and this process's pid.
// It serves Streamable HTTP on 127.0.0.1 (2026-07-28 requests through
// createMcpHandler, a 2025 client in a session of its own, so that its
// charge can be confirmed) and prints "listening <port>", or stdio with
// --stdio.
//
//   node server-v2.mjs [--stdio] [--delay-ms N]
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import {
  acceptedContent, classifyInboundRequest, createMcpHandler, inputRequired, isInitializeRequest, McpServer,
} from '@modelcontextprotocol/server';
import { serveStdio } from '@modelcontextprotocol/server/stdio';
import {
  localhostHostValidation, localhostOriginValidation, NodeStreamableHTTPServerTransport, toNodeHandler,
} from '@modelcontextprotocol/node';
import * as z from 'zod/v4';

const stdio = process.argv.includes('--stdio');
const delayArg = process.argv.indexOf('--delay-ms');
const delayMs = delayArg > 0 ? Number(process.argv[delayArg + 1]) : 0;
const invoices = []; // { number, customer, amount_cents, token }
const charges = []; // { number, customer, amount_cents, token }

const text = (t) => ({ content: [{ type: 'text', text: t }] });
const confirmation = z.object({ confirm: z.boolean() });

// token is the claim idemproxy forwards in _meta, or 0.
const token = (ctx) => ctx.mcpReq._meta?.['io.idemledger/claim']?.token ?? 0;

function newServer() {
  const server = new McpServer({ name: 'ts-v2-invoices', version: '1.0.0' });
  server.registerTool('create_invoice', {
    description: 'Create an invoice.',
    inputSchema: z.object({ customer: z.string(), currency: z.string(), amount_cents: z.number().int() }),
  }, async (args, ctx) => {
    if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
    const row = { number: invoices.length + 1, ...args, token: token(ctx) };
    invoices.push(row);
    return text(JSON.stringify({ id: `inv_${row.number}`, number: row.number }));
  });
  server.registerTool('charge', {
    description: 'Charge a customer, once they confirm.',
    inputSchema: z.object({ customer: z.string(), amount_cents: z.number().int() }),
  }, async (args, ctx) => {
    const answer = acceptedContent(ctx.mcpReq.inputResponses, 'confirm', confirmation);
    if (answer?.confirm !== true) {
      return inputRequired({ inputRequests: { confirm: inputRequired.elicit({
        message: `Charge ${args.customer} ${args.amount_cents} cents?`,
        requestedSchema: { type: 'object', properties: { confirm: { type: 'boolean' } }, required: ['confirm'] },
      }) } });
    }
    const row = { number: charges.length + 1, ...args, token: token(ctx) };
    charges.push(row);
    return text(JSON.stringify({ id: `ch_${row.number}`, number: row.number }));
  });
  server.registerTool('big_report', {
    description: 'A report of the bytes asked for.',
    inputSchema: z.object({ bytes: z.number().int() }),
  }, async ({ bytes }) => text('x'.repeat(bytes)));
  server.registerTool('count_writes', { description: 'How many rows there are.' }, async () =>
    text(JSON.stringify({ invoices: invoices.length, charges: charges.length, pid: process.pid })));
  return server;
}

if (stdio) {
  serveStdio(newServer);
} else {
  const modern = toNodeHandler(createMcpHandler(newServer));
  const sessions = {};
  const validHost = localhostHostValidation();
  const validOrigin = localhostOriginValidation();
  const httpServer = http.createServer(async (req, res) => {
    if (!validHost(req, res) || !validOrigin(req, res)) return;
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    const inbound = classifyInboundRequest({ httpMethod: req.method, protocolVersionHeader: req.headers['mcp-protocol-version'],
      mcpMethodHeader: req.headers['mcp-method'], body });
    if (inbound.kind !== 'legacy') {
      await modern(req, res, body);
      return;
    }
    let transport = sessions[req.headers['mcp-session-id']];
    if (!transport && isInitializeRequest(body)) {
      const server = newServer();
      transport = new NodeStreamableHTTPServerTransport({ sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => { sessions[id] = transport; } });
      transport.onclose = () => { delete sessions[transport.sessionId]; server.close(); };
      await server.connect(transport);
    }
    if (!transport) {
      res.writeHead(404, { 'Content-Type': 'application/json' }).end(JSON.stringify({
        jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Session not found' } }));
      return;
    }
    await transport.handleRequest(req, res, body);
  });
  httpServer.listen(0, '127.0.0.1', () => console.log(`listening ${httpServer.address().port}`));
}
