// The benchmark's MCP server on the TypeScript SDK: create_invoice and
// echo, both answering at once. With LEDGER_GRPC and IDEMLEDGER_GUARD (the
// path of a build's index.js), create_invoice runs under
// @idemledger/guard; without, nothing is guarded (for idemproxy to guard).
// It serves Streamable HTTP (stateless, JSON answers) on 127.0.0.1 and
// prints "listening <port>". BenchmarkToolCall (cmd/idemproxy) runs it.
import http from 'node:http';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

let guarded = (_name, handler) => handler;
let shape = {};
if (process.env.IDEMLEDGER_GUARD) {
  const { createLedger, Guard, keyShape, McpGuard } = await import(process.env.IDEMLEDGER_GUARD);
  const g = new McpGuard(new Guard(createLedger({ baseUrl: process.env.LEDGER_GRPC, protocol: 'grpc' })), 'acme');
  guarded = (name, handler) => g.tool(name, handler);
  shape = keyShape(z);
}
const handler = async ({ customer }) => ({ content: [{ type: 'text', text: JSON.stringify({ id: 'inv_1', customer }) }] });

const httpServer = http.createServer(async (req, res) => {
  const s = new McpServer({ name: 'bench', version: '1.0.0' });
  s.registerTool('create_invoice', { inputSchema: { customer: z.string(), ...shape } }, guarded('create_invoice', handler));
  s.registerTool('echo', { inputSchema: { customer: z.string() } }, handler);
  const t = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
  res.on('close', () => { t.close(); s.close(); });
  await s.connect(t);
  await t.handleRequest(req, res);
});
httpServer.listen(0, '127.0.0.1', () => console.log(`listening ${httpServer.address().port}`));
