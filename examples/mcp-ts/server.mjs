// A small MCP server on the official TypeScript SDK (v1), with write tools
// that have no idempotency of their own: create_invoice appends a row every
// time it runs; start_export, a tool that runs as a task (the 2025-11-25
// revision's tasks), starts an export every time it is called, which
// completes in the background. count_writes says how many rows and
// exports there are. It serves Streamable HTTP (stateless) on 127.0.0.1
// and prints "listening <port>", or stdio with --stdio.
//
//   node server.mjs [--stdio] [--delay-ms N]
import http from 'node:http';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { InMemoryTaskStore } from '@modelcontextprotocol/sdk/experimental/tasks/stores/in-memory.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

const stdio = process.argv.includes('--stdio');
const delayArg = process.argv.indexOf('--delay-ms');
const delayMs = delayArg > 0 ? Number(process.argv[delayArg + 1]) : 0;
const rows = []; // { number, customer, amount_cents, token }
let exports = 0;
const taskStore = new InMemoryTaskStore(); // shared: each request has a server of its own

function newServer() {
  const server = new McpServer({ name: 'ts-invoices', version: '1.0.0' }, {
    capabilities: { tasks: { requests: { tools: { call: {} } }, cancel: {} } }, taskStore,
  });
  server.experimental.tasks.registerToolTask('start_export', {
    description: 'Export the invoices, as a task.',
    inputSchema: { format: z.string() },
    execution: { taskSupport: 'optional' },
  }, {
    createTask: async ({ format }, extra) => {
      exports++;
      const task = await extra.taskStore.createTask({ ttl: 60_000, pollInterval: 20 });
      setTimeout(() => void taskStore.storeTaskResult(task.taskId, 'completed',
        { content: [{ type: 'text', text: `exported as ${format}` }] }), 50);
      return { task };
    },
    getTask: async (_args, extra) => extra.taskStore.getTask(extra.taskId),
    getTaskResult: async (_args, extra) => extra.taskStore.getTaskResult(extra.taskId),
  });
  server.registerTool('create_invoice', {
    description: 'Create an invoice.',
    inputSchema: { customer: z.string(), currency: z.string(), amount_cents: z.number().int() },
  }, async (args, extra) => {
    if (delayMs > 0) await new Promise((r) => setTimeout(r, delayMs));
    const claim = extra._meta?.['io.idemledger/claim'];
    const row = { number: rows.length + 1, ...args, token: claim?.token ?? 0 };
    rows.push(row);
    return { content: [{ type: 'text', text: JSON.stringify({ id: `inv_${row.number}`, number: row.number }) }] };
  });
  server.registerTool('count_writes', { description: 'How many invoice rows there are.' }, async () => ({
    content: [{ type: 'text', text: JSON.stringify({ rows: rows.length, exports }) }],
  }));
  return server;
}

if (stdio) {
  await newServer().connect(new StdioServerTransport());
} else {
  const httpServer = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    const server = newServer();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on('close', () => { transport.close(); server.close(); });
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  });
  httpServer.listen(0, '127.0.0.1', () => console.log(`listening ${httpServer.address().port}`));
}
