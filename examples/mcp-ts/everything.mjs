// An MCP server on the official TypeScript SDK with every fixture of the
// official conformance suite's server scenarios (@modelcontextprotocol/
// conformance): tools that log, report progress, sample and elicit,
// resources with subscriptions, prompts, completions, logging levels, a
// tool whose stream closes mid-call (resumed with Last-Event-ID), and
// DNS-rebinding protection. idemproxy's tests run the suite against it,
// directly and through the proxy, to show that the proxy passes
// everything through. With IDEMLEDGER_GUARD (the path of
// @idemledger/guard's dist/index.js) and LEDGER_URL, its tools that take
// arguments run under that guard, keys optional (the suite sends none):
// the guard must change nothing the suite checks. It serves Streamable HTTP with sessions on
// 127.0.0.1 and prints "listening <port>", or stdio with --stdio.
//
//   node everything.mjs [--stdio]
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer, ResourceTemplate } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { ElicitResultSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';
import { toJsonSchemaCompat } from '@modelcontextprotocol/sdk/server/zod-json-schema-compat.js';
import { z } from 'zod';

const IMAGE = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
const AUDIO = 'UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const text = (t) => ({ content: [{ type: 'text', text: t }] });
const transports = {}; // by session id, for closeSSEStream

// guarded is a tool's handler, under @idemledger/guard when it is loaded.
let guarded = (_name, handler) => handler;
if (process.env.IDEMLEDGER_GUARD) {
  const { createLedger, Guard, McpGuard } = await import(process.env.IDEMLEDGER_GUARD);
  const g = new McpGuard(new Guard(createLedger({ baseUrl: process.env.LEDGER_URL, token: process.env.LEDGER_TOKEN })), 'acme');
  guarded = (name, handler) => g.tool(name, handler, { policy: { keyOptional: true } });
}

// The schema of json_schema_2020_12_tool, as the suite expects it verbatim.
const schema2020 = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  type: 'object',
  $defs: { address: { type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } } },
  properties: { name: { type: 'string' }, address: { $ref: '#/$defs/address' } },
  additionalProperties: false,
};

// elicit asks the client for input and says what it answered. Requests to
// the client go with the call (extra.sendRequest), on its stream: a
// request sent apart from any call goes to the client's listening stream,
// which it may not have opened yet.
async function elicit(extra, message, properties, label) {
  try {
    const r = await extra.sendRequest({ method: 'elicitation/create', params: {
      message, requestedSchema: { type: 'object', properties, required: label === 'User response' ? ['response'] : [] },
    } }, ElicitResultSchema);
    return text(`${label}: action=${r.action}, content=${JSON.stringify(r.content || {})}`);
  } catch (e) {
    return text(`Elicitation not supported or error: ${e.message}`);
  }
}

function newServer() {
  const server = new McpServer({ name: 'ts-everything', version: '1.0.0' }, { capabilities: {
    tools: { listChanged: true }, resources: { subscribe: true, listChanged: true }, prompts: { listChanged: true },
    logging: {}, completions: {},
  } });
  // The tools that take arguments (the guard's handlers take them) go
  // under the guard when it is loaded.
  const register = server.registerTool.bind(server);
  server.registerTool = (name, config, handler) => register(name, config, config.inputSchema ? guarded(name, handler) : handler);
  const log = (data) => server.server.notification({ method: 'notifications/message',
    params: { level: 'info', logger: 'ts-everything', data } }).catch(() => {});

  server.tool('test_simple_text', 'Tests simple text content response', {}, async () =>
    text('This is a simple text response for testing.'));
  server.registerTool('test_image_content', { description: 'Tests image content response' }, async () =>
    ({ content: [{ type: 'image', data: IMAGE, mimeType: 'image/png' }] }));
  server.registerTool('test_audio_content', { description: 'Tests audio content response' }, async () =>
    ({ content: [{ type: 'audio', data: AUDIO, mimeType: 'audio/wav' }] }));
  server.registerTool('test_embedded_resource', { description: 'Tests embedded resource content response' }, async () =>
    ({ content: [{ type: 'resource', resource: { uri: 'test://embedded-resource', mimeType: 'text/plain',
      text: 'This is an embedded resource content.' } }] }));
  server.registerTool('test_multiple_content_types', { description: 'Tests response with multiple content types' }, async () =>
    ({ content: [
      { type: 'text', text: 'Multiple content types test:' },
      { type: 'image', data: IMAGE, mimeType: 'image/png' },
      { type: 'resource', resource: { uri: 'test://mixed-content-resource', mimeType: 'application/json',
        text: JSON.stringify({ test: 'data', value: 123 }) } },
    ] }));
  server.registerTool('test_tool_with_logging', { description: 'Logs while it runs', inputSchema: {} },
    async (_args, { sendNotification }) => {
      for (const data of ['Tool execution started', 'Tool processing data', 'Tool execution completed']) {
        await sendNotification({ method: 'notifications/message', params: { level: 'info', data } });
        await sleep(50);
      }
      return text('Tool with logging executed successfully');
    });
  server.registerTool('test_tool_with_progress', { description: 'Reports progress while it runs', inputSchema: {} },
    async (_args, { sendNotification, _meta }) => {
      const progressToken = _meta?.progressToken ?? 0;
      for (const progress of [0, 50, 100]) {
        await sendNotification({ method: 'notifications/progress',
          params: { progressToken, progress, total: 100, message: `Completed step ${progress} of 100` } });
        await sleep(50);
      }
      return text(String(progressToken));
    });
  server.registerTool('test_error_handling', { description: 'Tests error response handling' }, async () => {
    throw new Error('This tool intentionally returns an error for testing');
  });
  server.registerTool('test_reconnection', { description: 'Closes its stream mid-call (SEP-1699)', inputSchema: {} },
    async (_args, { sessionId, requestId }) => {
      if (sessionId && transports[sessionId] && requestId !== undefined) transports[sessionId].closeSSEStream(requestId);
      await sleep(100);
      return text('Reconnection test completed successfully. If you received this, the client properly reconnected after stream closure.');
    });
  server.registerTool('test_sampling', { description: 'Asks the client for a completion',
    inputSchema: { prompt: z.string().describe('The prompt to send to the LLM') } }, async ({ prompt }, extra) => {
    try {
      const r = await extra.sendRequest({ method: 'sampling/createMessage', params: {
        messages: [{ role: 'user', content: { type: 'text', text: prompt } }], maxTokens: 100,
      } }, z.object({}).passthrough());
      return text(`LLM response: ${r.content?.text || r.message?.content?.text || 'No response'}`);
    } catch (e) {
      return text(`Sampling not supported or error: ${e.message}`);
    }
  });
  server.registerTool('test_elicitation', { description: 'Asks the user for input',
    inputSchema: { message: z.string().describe('The message to show the user') } }, async ({ message }, extra) =>
    elicit(extra, message, { response: { type: 'string', description: "User's response" } }, 'User response'));
  server.registerTool('test_elicitation_sep1034_defaults', { description: 'Elicitation with defaults (SEP-1034)', inputSchema: {} },
    async (_args, extra) => elicit(extra, 'Please review and update the form fields with defaults', {
      name: { type: 'string', description: 'User name', default: 'John Doe' },
      age: { type: 'integer', description: 'User age', default: 30 },
      score: { type: 'number', description: 'User score', default: 95.5 },
      status: { type: 'string', description: 'User status', enum: ['active', 'inactive', 'pending'], default: 'active' },
      verified: { type: 'boolean', description: 'Verification status', default: true },
    }, 'Elicitation completed'));
  const titled = (prefix) => [1, 2, 3].map((n) => ({ const: `value${n}`, title: `${['First', 'Second', 'Third'][n - 1]} ${prefix}` }));
  server.registerTool('test_elicitation_sep1330_enums', { description: 'Elicitation with enums (SEP-1330)', inputSchema: {} },
    async (_args, extra) => elicit(extra, 'Please select options from the enum fields', {
      untitledSingle: { type: 'string', description: 'Select one option', enum: ['option1', 'option2', 'option3'] },
      titledSingle: { type: 'string', description: 'Select one option with titles', oneOf: titled('Option') },
      legacyEnum: { type: 'string', description: 'Select one option (legacy)', enum: ['opt1', 'opt2', 'opt3'],
        enumNames: ['Option One', 'Option Two', 'Option Three'] },
      untitledMulti: { type: 'array', description: 'Select multiple options', minItems: 1, maxItems: 3,
        items: { type: 'string', enum: ['option1', 'option2', 'option3'] } },
      titledMulti: { type: 'array', description: 'Select multiple options with titles', minItems: 1, maxItems: 3,
        items: { anyOf: titled('Choice') } },
    }, 'Elicitation completed'));
  server.registerTool('json_schema_2020_12_tool', { description: 'JSON Schema 2020-12 features (SEP-1613)', inputSchema: {
    name: z.string().optional(), address: z.object({ street: z.string().optional(), city: z.string().optional() }).optional(),
  } }, async (args) => text(`JSON Schema 2020-12 tool called with: ${JSON.stringify(args)}`));

  server.registerResource('static-text', 'test://static-text', { title: 'Static Text Resource', mimeType: 'text/plain' },
    async () => ({ contents: [{ uri: 'test://static-text', mimeType: 'text/plain', text: 'This is the content of the static text resource.' }] }));
  server.registerResource('static-binary', 'test://static-binary', { title: 'Static Binary Resource', mimeType: 'image/png' },
    async () => ({ contents: [{ uri: 'test://static-binary', mimeType: 'image/png', blob: IMAGE }] }));
  server.registerResource('template', new ResourceTemplate('test://template/{id}/data', { list: undefined }),
    { title: 'Resource Template', mimeType: 'application/json' }, async (uri, { id }) =>
      ({ contents: [{ uri: uri.toString(), mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) }] }));
  server.registerResource('watched-resource', 'test://watched-resource', { title: 'Watched Resource', mimeType: 'text/plain' },
    async () => ({ contents: [{ uri: 'test://watched-resource', mimeType: 'text/plain', text: 'Watched resource content' }] }));
  const subscriptions = new Set();
  const passthrough = (method) => z.object({ method: z.literal(method) }).passthrough();
  server.server.setRequestHandler(passthrough('resources/subscribe'), async ({ params }) => {
    subscriptions.add(params.uri);
    log(`Subscribed to resource: ${params.uri}`);
    return {};
  });
  server.server.setRequestHandler(passthrough('resources/unsubscribe'), async ({ params }) => {
    subscriptions.delete(params.uri);
    log(`Unsubscribed from resource: ${params.uri}`);
    return {};
  });

  server.registerPrompt('test_simple_prompt', { title: 'Simple Test Prompt', description: 'A simple prompt without arguments' }, async () =>
    ({ messages: [{ role: 'user', content: { type: 'text', text: 'This is a simple prompt for testing.' } }] }));
  server.registerPrompt('test_prompt_with_arguments', { title: 'Prompt With Arguments', description: 'A prompt with required arguments', argsSchema: {
    arg1: z.string().describe('First test argument'), arg2: z.string().describe('Second test argument'),
  } }, async ({ arg1, arg2 }) =>
    ({ messages: [{ role: 'user', content: { type: 'text', text: `Prompt with arguments: arg1='${arg1}', arg2='${arg2}'` } }] }));
  server.registerPrompt('test_prompt_with_embedded_resource', { title: 'Prompt With Embedded Resource', description: 'A prompt that includes an embedded resource',
    argsSchema: { resourceUri: z.string().describe('URI of the resource to embed') } }, async ({ resourceUri }) => ({ messages: [
    { role: 'user', content: { type: 'resource', resource: { uri: resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' } } },
    { role: 'user', content: { type: 'text', text: 'Please process the embedded resource above.' } },
  ] }));
  server.registerPrompt('test_prompt_with_image', { title: 'Prompt With Image', description: 'A prompt that includes image content' }, async () => ({ messages: [
    { role: 'user', content: { type: 'image', data: IMAGE, mimeType: 'image/png' } },
    { role: 'user', content: { type: 'text', text: 'Please analyze the image above.' } },
  ] }));

  server.server.setRequestHandler(passthrough('logging/setLevel'), async ({ params }) => {
    log(`Log level set to: ${params.level}`);
    return {};
  });
  server.server.setRequestHandler(passthrough('completion/complete'), async () =>
    ({ completion: { values: [], total: 0, hasMore: false } }));
  // tools/list by hand, for json_schema_2020_12_tool's schema verbatim.
  server.server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: Object.entries(server._registeredTools).filter(([, t]) => t.enabled).map(([name, t]) => ({
      name, title: t.title, description: t.description, annotations: t.annotations, _meta: t._meta,
      inputSchema: name === 'json_schema_2020_12_tool' ? schema2020
        : t.inputSchema ? toJsonSchemaCompat(t.inputSchema, { strictUnions: true, pipeStrategy: 'input' })
          : { type: 'object', properties: {} },
    })),
  }));
  return server;
}

// events is an in-memory event store, so that a client resumes a stream
// with Last-Event-ID.
function events() {
  const all = [];
  return {
    async storeEvent(streamId, message) {
      const eventId = `${streamId}::${String(all.length).padStart(8, '0')}`;
      all.push({ eventId, streamId, message });
      return eventId;
    },
    async replayEventsAfter(lastEventId, { send }) {
      const streamId = lastEventId.split('::')[0];
      for (const e of all) {
        if (e.streamId === streamId && e.eventId > lastEventId && Object.keys(e.message).length > 0) await send(e.eventId, e.message);
      }
      return streamId;
    },
  };
}

// local reports whether a Host or Origin names this machine (DNS-rebinding
// protection).
function local(value, origin) {
  if (!value) return !origin;
  try {
    const host = new URL(origin ? value : `http://${value}`).hostname;
    return ['localhost', '127.0.0.1', '[::1]'].includes(host);
  } catch {
    return false;
  }
}

if (process.argv.includes('--stdio')) {
  await newServer().connect(new StdioServerTransport());
} else {
  const httpServer = http.createServer(async (req, res) => {
    if (!local(req.headers.host, false) || (req.headers.origin && !local(req.headers.origin, true))) {
      res.writeHead(403, { 'Content-Type': 'application/json' }).end(JSON.stringify({
        jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Forbidden: the Host or Origin is not this machine' } }));
      return;
    }
    const chunks = [];
    for await (const c of req) chunks.push(c);
    let body;
    try {
      body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    } catch {
      res.writeHead(400).end('malformed JSON');
      return;
    }
    const sid = req.headers['mcp-session-id'];
    let transport = sid ? transports[sid] : undefined;
    if (!transport) {
      if (sid || req.method !== 'POST' || body?.method !== 'initialize') {
        res.writeHead(sid ? 404 : 400, { 'Content-Type': 'application/json' }).end(JSON.stringify({
          jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Invalid or missing session ID' } }));
        return;
      }
      const server = newServer();
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(), eventStore: events(), retryInterval: 500,
        onsessioninitialized: (id) => { transports[id] = transport; },
      });
      transport.onclose = () => {
        if (transport.sessionId) delete transports[transport.sessionId];
        server.close();
      };
      await server.connect(transport);
    }
    await transport.handleRequest(req, res, body);
  });
  httpServer.listen(0, '127.0.0.1', () => console.log(`listening ${httpServer.address().port}`));
}
