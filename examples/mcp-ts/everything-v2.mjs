// An MCP server on the official TypeScript SDK's v2 packages with every
// fixture that the official conformance suite's server scenarios call
// (@modelcontextprotocol/conformance 0.2): the 2025 fixtures of
// everything.mjs (tools that log, report progress, sample and elicit,
// resources with subscriptions, prompts, completions, logging levels, a
// tool whose stream closes mid-call) and the 2026-07-28 ones
// (input_required rounds with an integrity-protected requestState, a tool
// whose argument is mirrored into an Mcp-Param header, the stateless
// diagnostics, list changes for subscriptions/listen). idemproxy's tests
// run the suite against it, directly and through the proxy. With
// IDEMLEDGER_GUARD (the path of @idemledger/guard's dist/index.js) and
// LEDGER_URL, its tools that take arguments run under that guard, keys
// optional (the suite sends none): the guard must change nothing the suite
// checks.
//
// Over Streamable HTTP (on 127.0.0.1; it prints "listening <port>") a
// request of the 2026-07-28 revision is served by createMcpHandler, one
// instance a request, and a 2025 one by a session of its own (initialize);
// over stdio (--stdio) serveStdio serves the era the client opens with.
//
//   node everything-v2.mjs [--stdio]
import http from 'node:http';
import { randomUUID, getRandomValues } from 'node:crypto';
import {
  acceptedContent, classifyInboundRequest, CLIENT_CAPABILITIES_META_KEY, createMcpHandler, createRequestStateCodec,
  fromJsonSchema, inputRequired, isInitializeRequest, McpServer, ResourceTemplate,
} from '@modelcontextprotocol/server';
import { serveStdio } from '@modelcontextprotocol/server/stdio';
import {
  localhostHostValidation, localhostOriginValidation, NodeStreamableHTTPServerTransport, toNodeHandler,
} from '@modelcontextprotocol/node';
import * as z from 'zod/v4';

const IMAGE = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==';
const AUDIO = 'UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=';
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const text = (t) => ({ content: [{ type: 'text', text: t }] });
const object = (properties, required = Object.keys(properties)) => ({ type: 'object', properties, required });
const sessions = {}; // 2025 sessions over Streamable HTTP, by id

// requestState comes back from the client: sealed with a key of this
// process, and verified before a handler sees it.
const stateCodec = createRequestStateCodec({ key: getRandomValues(new Uint8Array(32)) });

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
  $defs: { address: { $anchor: 'addressDef', type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } } },
  properties: {
    name: { type: 'string' }, address: { $ref: '#/$defs/address' }, contactMethod: { type: 'string', enum: ['phone', 'email'] },
    phone: { type: 'string' }, email: { type: 'string' },
  },
  allOf: [{ anyOf: [{ required: ['phone'] }, { required: ['email'] }] }],
  if: { properties: { contactMethod: { const: 'phone' } }, required: ['contactMethod'] },
  then: { required: ['phone'] },
  else: { required: ['email'] },
  additionalProperties: false,
};

// related sends a request to the client on the stream of the call that
// asks it (the 2025 push): the SDK's elicitInput and requestSampling send
// it on the session's listening stream otherwise, which a client may not
// have opened yet.
const related = (ctx) => ({ relatedRequestId: ctx.mcpReq.id });

// elicit asks the client for input (the 2025 push) and says what it
// answered.
async function elicit(ctx, message, requestedSchema, label) {
  try {
    const r = await ctx.mcpReq.elicitInput({ message, requestedSchema }, related(ctx));
    return text(`${label}: action=${r.action}, content=${JSON.stringify(r.content || {})}`);
  } catch (e) {
    return text(`Elicitation not supported or error: ${e.message}`);
  }
}

// askName is one input_required round that asks for a name under key.
const askName = (message = 'What is your name?') =>
  inputRequired.elicit({ message, requestedSchema: object({ name: { type: 'string' } }) });

function newServer() {
  const server = new McpServer({ name: 'ts-v2-everything', version: '1.0.0' }, {
    capabilities: {
      tools: { listChanged: true }, resources: { subscribe: true, listChanged: true }, prompts: { listChanged: true },
      logging: {}, completions: {},
    },
    requestState: { verify: stateCodec.verify },
  });
  // The tools that take arguments go under the guard when it is loaded.
  const tool = (name, config, handler) => server.registerTool(name, config, config.inputSchema ? guarded(name, handler) : handler);
  const none = z.object({});
  const log = (data) => server.server.notification({ method: 'notifications/message',
    params: { level: 'info', logger: 'ts-v2-everything', data } }).catch(() => {});

  tool('test_simple_text', { description: 'Tests simple text content response' }, async () =>
    text('This is a simple text response for testing.'));
  tool('test_image_content', { description: 'Tests image content response' }, async () =>
    ({ content: [{ type: 'image', data: IMAGE, mimeType: 'image/png' }] }));
  tool('test_audio_content', { description: 'Tests audio content response' }, async () =>
    ({ content: [{ type: 'audio', data: AUDIO, mimeType: 'audio/wav' }] }));
  tool('test_embedded_resource', { description: 'Tests embedded resource content response' }, async () =>
    ({ content: [{ type: 'resource', resource: { uri: 'test://embedded-resource', mimeType: 'text/plain',
      text: 'This is an embedded resource content.' } }] }));
  tool('test_multiple_content_types', { description: 'Tests response with multiple content types' }, async () =>
    ({ content: [
      { type: 'text', text: 'Multiple content types test:' },
      { type: 'image', data: IMAGE, mimeType: 'image/png' },
      { type: 'resource', resource: { uri: 'test://mixed-content-resource', mimeType: 'application/json',
        text: JSON.stringify({ test: 'data', value: 123 }) } },
    ] }));
  tool('test_tool_with_logging', { description: 'Logs while it runs', inputSchema: none }, async (_args, ctx) => {
    for (const data of ['Tool execution started', 'Tool processing data', 'Tool execution completed']) {
      await ctx.mcpReq.notify({ method: 'notifications/message', params: { level: 'info', data } });
      await sleep(50);
    }
    return text('Tool with logging executed successfully');
  });
  tool('test_tool_with_progress', { description: 'Reports progress while it runs', inputSchema: none }, async (_args, ctx) => {
    const progressToken = ctx.mcpReq._meta?.progressToken;
    if (progressToken !== undefined) {
      for (const progress of [0, 50, 100]) {
        await ctx.mcpReq.notify({ method: 'notifications/progress',
          params: { progressToken, progress, total: 100, message: `Completed step ${progress} of 100` } });
        if (progress < 100) await sleep(50);
      }
    }
    return text(String(progressToken ?? 'no-progress-token'));
  });
  tool('test_error_handling', { description: 'Tests error response handling' }, async () => {
    throw new Error('This tool intentionally returns an error for testing');
  });
  tool('test_reconnection', { description: 'Closes its stream mid-call (SEP-1699)', inputSchema: none }, async (_args, ctx) => {
    ctx.http?.closeSSE?.();
    await sleep(100);
    return text('Reconnection test completed successfully. If you received this, the client properly reconnected after stream closure.');
  });
  tool('test_sampling', { description: 'Asks the client for a completion',
    inputSchema: z.object({ prompt: z.string().describe('The prompt to send to the LLM') }) }, async ({ prompt }, ctx) => {
    try {
      const r = await ctx.mcpReq.requestSampling({ messages: [{ role: 'user', content: { type: 'text', text: prompt } }], maxTokens: 100 }, related(ctx));
      return text(`LLM response: ${r.content?.text || 'No response'}`);
    } catch (e) {
      return text(`Sampling not supported or error: ${e.message}`);
    }
  });
  tool('test_elicitation', { description: 'Asks the user for input',
    inputSchema: z.object({ message: z.string().describe('The message to show the user') }) }, async ({ message }, ctx) =>
    elicit(ctx, message, object({ response: { type: 'string', description: "User's response" } }), 'User response'));
  tool('test_elicitation_sep1034_defaults', { description: 'Elicitation with defaults (SEP-1034)', inputSchema: none },
    async (_args, ctx) => elicit(ctx, 'Please review and update the form fields with defaults', object({
      name: { type: 'string', description: 'User name', default: 'John Doe' },
      age: { type: 'integer', description: 'User age', default: 30 },
      score: { type: 'number', description: 'User score', default: 95.5 },
      status: { type: 'string', description: 'User status', enum: ['active', 'inactive', 'pending'], default: 'active' },
      verified: { type: 'boolean', description: 'Verification status', default: true },
    }, []), 'Elicitation completed'));
  const titled = (prefix) => [1, 2, 3].map((n) => ({ const: `value${n}`, title: `${['First', 'Second', 'Third'][n - 1]} ${prefix}` }));
  tool('test_elicitation_sep1330_enums', { description: 'Elicitation with enums (SEP-1330)', inputSchema: none },
    async (_args, ctx) => elicit(ctx, 'Please select options from the enum fields', object({
      untitledSingle: { type: 'string', description: 'Select one option', enum: ['option1', 'option2', 'option3'] },
      titledSingle: { type: 'string', description: 'Select one option with titles', oneOf: titled('Option') },
      legacyEnum: { type: 'string', description: 'Select one option (legacy)', enum: ['opt1', 'opt2', 'opt3'],
        enumNames: ['Option One', 'Option Two', 'Option Three'] },
      untitledMulti: { type: 'array', description: 'Select multiple options', minItems: 1, maxItems: 3,
        items: { type: 'string', enum: ['option1', 'option2', 'option3'] } },
      titledMulti: { type: 'array', description: 'Select multiple options with titles', minItems: 1, maxItems: 3,
        items: { anyOf: titled('Choice') } },
    }, []), 'Elicitation completed'));
  tool('json_schema_2020_12_tool', { description: 'JSON Schema 2020-12 features (SEP-1613, SEP-2106)',
    inputSchema: fromJsonSchema(schema2020) }, async (args) => text(`JSON Schema 2020-12 tool called with: ${JSON.stringify(args)}`));

  // The 2026-07-28 fixtures.
  tool('test_x_mcp_header', { description: 'Tests SEP-2243 Mcp-Param-* server-side validation', inputSchema: fromJsonSchema({
    type: 'object', properties: {
      region: { type: 'string', description: 'mirrored into Mcp-Param-Region', 'x-mcp-header': 'Region' },
      level: { type: 'integer', description: 'non-mirrored argument' },
      count: { type: 'integer', description: 'mirrored into Mcp-Param-Count', 'x-mcp-header': 'Count' },
      flag: { type: 'boolean', description: 'mirrored into Mcp-Param-Flag', 'x-mcp-header': 'Flag' },
      zone: { type: 'string', description: 'not mirrored: x-mcp-header is matched by its exact name', 'X-MCP-HEADER': 'Zone' },
    },
  }) }, async (args) => text(`region=${args.region ?? '<none>'}`));
  tool('test_missing_capability', { description: 'Needs the sampling client capability', inputSchema: none }, async (_args, ctx) =>
    ctx.mcpReq.inputResponses?.llm_answer === undefined
      ? inputRequired({ inputRequests: { llm_answer: inputRequired.createMessage({
        messages: [{ role: 'user', content: { type: 'text', text: 'Reply with the single word: pong' } }], maxTokens: 16 }) } })
      : text('sampling round-trip complete'));
  tool('test_streaming_elicitation', { description: 'A response stream with no requests of its own', inputSchema: none }, async () =>
    text('stream observed: result frames only, no top-level requests'));
  tool('test_logging_tool', { description: 'Logs only when the request sets _meta.logLevel', inputSchema: none }, async (_args, ctx) => {
    await ctx.mcpReq.log('info', 'test_logging_tool ran');
    return text('logged through the request-scoped, logLevel-gated channel');
  });
  tool('test_input_required_result_elicitation', { description: 'Asks for a name in an input_required round', inputSchema: none },
    async (_args, ctx) => {
      const name = acceptedContent(ctx.mcpReq.inputResponses, 'user_name')?.name;
      return typeof name === 'string' ? text(`Hello, ${name}!`) : inputRequired({ inputRequests: { user_name: askName() } });
    });
  tool('test_input_required_result_sampling', { description: 'Asks for a completion in an input_required round', inputSchema: none },
    async (_args, ctx) => {
      const answer = ctx.mcpReq.inputResponses?.capital_question;
      if (answer === undefined) {
        return inputRequired({ inputRequests: { capital_question: inputRequired.createMessage({
          messages: [{ role: 'user', content: { type: 'text', text: 'What is the capital of France?' } }], maxTokens: 100 }) } });
      }
      return text(`Sampling response: ${typeof answer.content?.text === 'string' ? answer.content.text : JSON.stringify(answer)}`);
    });
  tool('test_input_required_result_list_roots', { description: 'Asks for the roots in an input_required round', inputSchema: none },
    async (_args, ctx) => {
      const roots = ctx.mcpReq.inputResponses?.client_roots?.roots;
      if (!Array.isArray(roots)) return inputRequired({ inputRequests: { client_roots: inputRequired.listRoots() } });
      return text(`Client exposed ${roots.length} root(s): ${roots.map((r) => r.uri).join(', ')}`);
    });
  const confirm = () => inputRequired.elicit({ message: 'Please confirm', requestedSchema: object({ ok: { type: 'boolean' } }) });
  tool('test_input_required_result_request_state', { description: 'Round-trips a sealed requestState', inputSchema: none },
    async (_args, ctx) => {
      if (acceptedContent(ctx.mcpReq.inputResponses, 'confirm') === undefined) {
        return inputRequired({ inputRequests: { confirm: confirm() },
          requestState: await stateCodec.mint({ tool: 'request_state', nonce: randomUUID() }) });
      }
      if (ctx.mcpReq.requestState() === undefined) throw new Error('Invalid requestState: missing');
      return text('state-ok: requestState verified and confirmation received');
    });
  tool('test_input_required_result_multiple_inputs', { description: 'Asks for three inputs in one round', inputSchema: none },
    async (_args, ctx) => {
      const r = ctx.mcpReq.inputResponses;
      const name = acceptedContent(r, 'user_name')?.name;
      const greeting = r?.greeting?.content?.text;
      const roots = r?.client_roots?.roots;
      if (typeof name !== 'string' || typeof greeting !== 'string' || !Array.isArray(roots)) {
        return inputRequired({ inputRequests: {
          user_name: askName(),
          greeting: inputRequired.createMessage({ messages: [{ role: 'user', content: { type: 'text', text: 'Generate a greeting' } }], maxTokens: 50 }),
          client_roots: inputRequired.listRoots(),
        }, requestState: await stateCodec.mint({ tool: 'multiple_inputs', nonce: randomUUID() }) });
      }
      return text(`${greeting} ${name} — ${roots.length} root(s) visible`);
    });
  tool('test_input_required_result_multi_round', { description: 'Two rounds, the state changing between them', inputSchema: none },
    async (_args, ctx) => {
      const state = ctx.mcpReq.requestState();
      const round = state?.tool === 'multi_round' && typeof state.round === 'number' ? state.round : 0;
      if (round === 0) {
        return inputRequired({ inputRequests: { step1: askName('Step 1: What is your name?') },
          requestState: await stateCodec.mint({ tool: 'multi_round', round: 1, nonce: randomUUID() }) });
      }
      if (round === 1) {
        const name = acceptedContent(ctx.mcpReq.inputResponses, 'step1')?.name ?? 'unknown';
        return inputRequired({ inputRequests: { step2: inputRequired.elicit({ message: 'Step 2: What is your favorite color?',
          requestedSchema: object({ color: { type: 'string' } }) }) },
        requestState: await stateCodec.mint({ tool: 'multi_round', round: 2, name, nonce: randomUUID() }) });
      }
      const color = acceptedContent(ctx.mcpReq.inputResponses, 'step2')?.color ?? 'unknown';
      return text(`Multi-round complete: ${String(state?.name ?? 'unknown')} likes ${color}`);
    });
  tool('test_input_required_result_tampered_state', { description: 'Refuses a requestState that fails verification', inputSchema: none },
    async (_args, ctx) => {
      if (ctx.mcpReq.requestState() !== undefined && acceptedContent(ctx.mcpReq.inputResponses, 'confirm') !== undefined) {
        return text('integrity-ok: requestState verified');
      }
      return inputRequired({ inputRequests: { confirm: confirm() },
        requestState: await stateCodec.mint({ tool: 'tampered_state', nonce: randomUUID() }) });
    });
  tool('test_input_required_result_capabilities', { description: 'Asks only for what the client declared', inputSchema: none },
    async (_args, ctx) => {
      if (ctx.mcpReq.inputResponses !== undefined) return text('Capability-aware input requests fulfilled');
      const declared = ctx.mcpReq.envelope?.[CLIENT_CAPABILITIES_META_KEY];
      const inputRequests = {};
      if (declared?.elicitation !== undefined) inputRequests.user_name = askName();
      if (declared?.sampling !== undefined) {
        inputRequests.greeting = inputRequired.createMessage({ messages: [{ role: 'user', content: { type: 'text', text: 'Generate a short greeting' } }], maxTokens: 50 });
      }
      if (declared?.roots !== undefined) inputRequests.client_roots = inputRequired.listRoots();
      if (Object.keys(inputRequests).length === 0) return text('No declared client capability supports an in-band input request');
      return inputRequired({ inputRequests });
    });
  // A list change goes to the subscriptions (subscriptions/listen) by the
  // HTTP handler's bus, or on stdio from the instance itself.
  tool('test_trigger_tool_change', { description: 'Publishes a tools/list_changed event', inputSchema: none }, async () => {
    if (modern) modern.notify.toolsChanged();
    else server.sendToolListChanged();
    return text('tools_list_changed published');
  });
  tool('test_trigger_prompt_change', { description: 'Publishes a prompts/list_changed event', inputSchema: none }, async () => {
    if (modern) modern.notify.promptsChanged();
    else server.sendPromptListChanged();
    return text('prompts_list_changed published');
  });

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
  server.server.setRequestHandler('resources/subscribe', async ({ params }) => {
    subscriptions.add(params.uri);
    log(`Subscribed to resource: ${params.uri}`);
    return {};
  });
  server.server.setRequestHandler('resources/unsubscribe', async ({ params }) => {
    subscriptions.delete(params.uri);
    log(`Unsubscribed from resource: ${params.uri}`);
    return {};
  });

  const user = (content) => ({ role: 'user', content });
  server.registerPrompt('test_simple_prompt', { title: 'Simple Test Prompt', description: 'A simple prompt without arguments' }, async () =>
    ({ messages: [user({ type: 'text', text: 'This is a simple prompt for testing.' })] }));
  server.registerPrompt('test_prompt_with_arguments', { title: 'Prompt With Arguments', description: 'A prompt with required arguments',
    argsSchema: z.object({ arg1: z.string().describe('First test argument'), arg2: z.string().describe('Second test argument') }) },
  async ({ arg1, arg2 }) => ({ messages: [user({ type: 'text', text: `Prompt with arguments: arg1='${arg1}', arg2='${arg2}'` })] }));
  server.registerPrompt('test_prompt_with_embedded_resource', { title: 'Prompt With Embedded Resource',
    description: 'A prompt that includes an embedded resource', argsSchema: z.object({ resourceUri: z.string().describe('URI of the resource to embed') }) },
  async ({ resourceUri }) => ({ messages: [
    user({ type: 'resource', resource: { uri: resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' } }),
    user({ type: 'text', text: 'Please process the embedded resource above.' }),
  ] }));
  server.registerPrompt('test_prompt_with_image', { title: 'Prompt With Image', description: 'A prompt that includes image content' }, async () =>
    ({ messages: [user({ type: 'image', data: IMAGE, mimeType: 'image/png' }), user({ type: 'text', text: 'Please analyze the image above.' })] }));
  server.registerPrompt('test_input_required_result_prompt', { title: 'MRTR Prompt', description: 'A prompt that asks for context first' },
    async (ctx) => {
      const context = acceptedContent(ctx.mcpReq.inputResponses, 'user_context')?.context;
      if (typeof context !== 'string') {
        return inputRequired({ inputRequests: { user_context: inputRequired.elicit({ message: 'What context should the prompt use?',
          requestedSchema: object({ context: { type: 'string' } }) }) } });
      }
      return { messages: [user({ type: 'text', text: `Use the following context: ${context}` })] };
    });

  server.server.setRequestHandler('logging/setLevel', async ({ params }) => {
    log(`Log level set to: ${params.level}`);
    return {};
  });
  server.server.setRequestHandler('completion/complete', async () => ({ completion: { values: [], total: 0, hasMore: false } }));
  return server;
}

// events is an in-memory event store, so that a 2025 client resumes a
// stream with Last-Event-ID.
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

let modern;
if (process.argv.includes('--stdio')) {
  serveStdio(newServer);
} else {
  // The suite sends malformed requests on purpose: their errors are its
  // checks, not this server's.
  modern = createMcpHandler(newServer, { onerror: () => {} });
  const modernNode = toNodeHandler(modern);
  const validHost = localhostHostValidation();
  const validOrigin = localhostOriginValidation();
  const error = (res, status, message) => res.writeHead(status, { 'Content-Type': 'application/json' })
    .end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message } }));
  const httpServer = http.createServer(async (req, res) => {
    if (!validHost(req, res) || !validOrigin(req, res)) return;
    const chunks = [];
    for await (const c of req) chunks.push(c);
    let body;
    try {
      body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    } catch {
      res.writeHead(400).end('malformed JSON');
      return;
    }
    const inbound = classifyInboundRequest({ httpMethod: req.method, protocolVersionHeader: req.headers['mcp-protocol-version'],
      mcpMethodHeader: req.headers['mcp-method'], body });
    if (inbound.kind !== 'legacy') {
      await modernNode(req, res, body);
      return;
    }
    const sid = req.headers['mcp-session-id'];
    let transport = sid ? sessions[sid] : undefined;
    if (!transport) {
      if (sid) return error(res, 404, 'Session not found');
      if (req.method !== 'POST' || !isInitializeRequest(body)) return error(res, 400, 'Bad Request: Session ID required');
      const server = newServer();
      transport = new NodeStreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(), eventStore: events(), retryInterval: 500,
        onsessioninitialized: (id) => { sessions[id] = transport; },
      });
      transport.onclose = () => {
        if (transport.sessionId) delete sessions[transport.sessionId];
        server.close();
      };
      await server.connect(transport);
    }
    await transport.handleRequest(req, res, body);
  });
  httpServer.listen(0, '127.0.0.1', () => console.log(`listening ${httpServer.address().port}`));
}
