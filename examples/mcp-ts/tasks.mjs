// An agent on the official TypeScript SDK (v1) that runs a tool as a task
// (the 2025-11-25 revision's tasks) with an idempotency key: it calls
// start_export, task-augmented, twice with the same key, polls the task
// until it completes, reads its result, and prints what it saw as one
// JSON object: the two tasks' ids, the task's last status, its result,
// and count_writes.
//
//   node tasks.mjs http://127.0.0.1:8091/mcp key
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, CreateTaskResultSchema, GetTaskResultSchema } from '@modelcontextprotocol/sdk/types.js';

const [url, key] = process.argv.slice(2);
const client = new Client({ name: 'ts-task-agent', version: '1.0.0' }, { capabilities: { tasks: {} } });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const start = () => client.request({ method: 'tools/call', params: { name: 'start_export', arguments: { format: 'csv' },
  task: { ttl: 60_000 }, _meta: { 'io.idemledger/idempotency-key': key } } }, CreateTaskResultSchema);
const first = await start();
const retry = await start();
let task = first.task;
for (let i = 0; i < 200 && task.status === 'working'; i++) {
  await new Promise((r) => setTimeout(r, 20));
  task = await client.request({ method: 'tasks/get', params: { taskId: first.task.taskId } }, GetTaskResultSchema);
}
const result = await client.request({ method: 'tasks/result', params: { taskId: first.task.taskId } }, CallToolResultSchema);
const count = JSON.parse((await client.callTool({ name: 'count_writes', arguments: {} })).content[0].text);
console.log(JSON.stringify({ first: first.task.taskId, retry: retry.task.taskId, retryMeta: retry._meta ?? {}, status: task.status, result, count }));
await client.close();
