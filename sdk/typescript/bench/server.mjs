// The benchmark's MCP server: create_invoice and echo, both answering at
// once, on the official TypeScript SDK's v2 packages (--sdk v2, the
// default: both eras, through createMcpHandler) or on v1 (--sdk v1: the
// 2025 revisions, a stateless transport per request). With IDEMLEDGER_GUARD
// (the path of the package's dist/index.js) and LEDGER_URL (ledgerd's
// Connect listener, as the README configures the guard; LEDGER_PROTOCOL
// "grpc" for its gRPC listener), create_invoice runs under
// @idemledger/guard for tenant acme; echo never does. Without, nothing is
// guarded (for idemproxy to guard). It serves Streamable HTTP on 127.0.0.1
// and prints "listening <port>", or stdio with --stdio.
//
//   node server.mjs [--sdk v1|v2] [--stdio]
import http from 'node:http';
import { z } from 'zod';

const sdk = process.argv.includes('--sdk') ? process.argv[process.argv.indexOf('--sdk') + 1] : 'v2';
const stdio = process.argv.includes('--stdio');
process.on('SIGTERM', () => process.exit(0)); // exit, writing what --cpu-prof asks for

let guarded = (_name, handler) => handler;
let shape = {};
if (process.env.IDEMLEDGER_GUARD) {
  const { createLedger, Guard, keyShape, McpGuard } = await import(process.env.IDEMLEDGER_GUARD);
  const ledger = createLedger({ baseUrl: process.env.LEDGER_URL, protocol: process.env.LEDGER_PROTOCOL || undefined });
  const g = new McpGuard(new Guard(ledger), 'acme');
  guarded = (name, handler) => g.tool(name, handler);
  shape = keyShape(z);
}
const handler = async ({ customer }) => ({ content: [{ type: 'text', text: JSON.stringify({ id: 'inv_1', customer }) }] });

function register(s) {
  s.registerTool('create_invoice', { inputSchema: z.object({ customer: z.string(), ...shape }) }, guarded('create_invoice', handler));
  s.registerTool('echo', { inputSchema: z.object({ customer: z.string() }) }, handler);
  return s;
}

if (sdk === 'v2') {
  const { createMcpHandler, McpServer } = await import('@modelcontextprotocol/server');
  const newServer = () => register(new McpServer({ name: 'bench', version: '1.0.0' }));
  if (stdio) {
    const { serveStdio } = await import('@modelcontextprotocol/server/stdio');
    serveStdio(newServer);
  } else {
    const { toNodeHandler } = await import('@modelcontextprotocol/node');
    listen(toNodeHandler(createMcpHandler(newServer, { response: 'json' })));
  }
} else {
  const { McpServer } = await import('@modelcontextprotocol/sdk/server/mcp.js');
  const newServer = () => register(new McpServer({ name: 'bench', version: '1.0.0' }));
  if (stdio) {
    const { StdioServerTransport } = await import('@modelcontextprotocol/sdk/server/stdio.js');
    await newServer().connect(new StdioServerTransport());
  } else {
    const { StreamableHTTPServerTransport } = await import('@modelcontextprotocol/sdk/server/streamableHttp.js');
    listen(async (req, res) => {
      const s = newServer();
      const t = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
      res.on('close', () => { t.close(); s.close(); });
      await s.connect(t);
      await t.handleRequest(req, res);
    });
  }
}

function listen(handle) {
  const server = http.createServer(handle);
  server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
}
