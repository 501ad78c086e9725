// The MCP targets of docs/performance.md in one run: what @idemledger/guard
// and idemproxy add to a tools/call, as ratios of calls measured in turns
// on one machine. It starts ledgerd on its embedded store, the benchmark
// servers (server.mjs) and idemproxy, and drives them with the official v2
// client (@modelcontextprotocol/client), a fresh key per call:
//   - guard: a v2 and a v1 server whose create_invoice is guarded, against
//     the same server's unguarded echo, on the 2026-07-28 revision (v2 only:
//     the v1 SDK serves the 2025 revisions) and the 2025 handshake;
//   - proxy: create_invoice through idemproxy against the same call sent
//     straight to the server it fronts: over Streamable HTTP; and over
//     stdio, the client running `idemproxy --stdio` (which runs the server
//     as its stdio child) against the client running the server itself;
//     and, for the breakdown, the unguarded echo through the proxy against
//     echo sent straight (pass-through), over each; with the CPU
//     idemproxy used a call at --clients (its one process over HTTP, the
//     clients' --clients processes over stdio); and for every pair, the
//     CPU the whole machine used a call at --clients on each side (every
//     process, the kernel's work included), and ledgerd's on the test side;
//   - guard-cpu: McpGuard's tool called in this process, with no MCP
//     transport, --clients calls at once: the CPU a guarded call costs
//     its server beyond the MCP call itself.
// At 1 client each side of a pair takes --block calls in turn until each
// has made --calls; the p50s are compared (target: guarded at most 1.3×).
// At --clients concurrent clients each side runs for --seconds in turn,
// --rounds times; the calls a second are compared (target: at least 0.7×).
//
//   npm run build && node bench/mcp.mjs --ledgerd BIN --idemproxy BIN [--calls 600]
//     [--block 50] [--clients 32] [--seconds 3] [--rounds 2] [--only NAME,...] [--json FILE]
//     [--guard PATH (the package's index.js; dist/index.js when absent)]
//     [--ledgerd-procs N] [--proxy-procs N (GOMAXPROCS of ledgerd, of idemproxy: a process
//     sized to N cores; the machine's cores when absent)]
//     [--guard-protocol connect|grpc (the guard's ledger client on ledgerd's Connect
//     listener, as the README sets it up, or with protocol "grpc" on its gRPC listener)]
//
// `make bench-mcp` builds both binaries and runs it.
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const here = dirname(fileURLToPath(import.meta.url));
const { values: opt } = parseArgs({
  options: {
    ledgerd: { type: 'string' }, idemproxy: { type: 'string' }, guard: { type: 'string', default: join(here, '..', 'dist', 'index.js') },
    calls: { type: 'string', default: '600' }, block: { type: 'string', default: '50' },
    clients: { type: 'string', default: '32' }, seconds: { type: 'string', default: '3' },
    rounds: { type: 'string', default: '2' }, only: { type: 'string', default: '' }, json: { type: 'string', default: '' },
    'ledgerd-procs': { type: 'string', default: '' }, 'proxy-procs': { type: 'string', default: '' },
    'guard-protocol': { type: 'string', default: 'connect' },
  },
});
if (!opt.ledgerd || !opt.idemproxy || !['connect', 'grpc'].includes(opt['guard-protocol'])) {
  console.error('usage: node bench/mcp.mjs --ledgerd BIN --idemproxy BIN [--calls N] [--block N] [--clients N] [--seconds S] [--rounds N] [--only NAME,...] [--json FILE] [--guard PATH] [--ledgerd-procs N] [--proxy-procs N] [--guard-protocol connect|grpc]');
  process.exit(2);
}
const calls = Number(opt.calls), block = Number(opt.block), clients = Number(opt.clients);
const seconds = Number(opt.seconds), rounds = Number(opt.rounds);
const only = opt.only ? opt.only.split(',') : [];
// procs is the environment that sizes a Go process to n cores (none: every core).
const procs = (n) => n ? { GOMAXPROCS: n } : {};

const children = [];
const dir = mkdtempSync(join(tmpdir(), 'idemledger-bench-mcp-'));
process.on('exit', () => {
  for (const c of children) c.kill('SIGTERM');
  rmSync(dir, { recursive: true, force: true });
});
process.on('SIGINT', () => process.exit(130));

// start runs a process and resolves with the first line of its output
// for which ready returns a value; the promise's pid is the process's.
function start(cmd, args, env, ready) {
  const child = spawn(cmd, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  const started = new Promise((resolve, reject) => {
    let done = false;
    const lines = [];
    const read = (stream) => createInterface({ input: stream }).on('line', (line) => {
      if (done) return;
      lines.push(line);
      const v = ready(line);
      if (v !== undefined) {
        done = true;
        resolve(v);
      }
    });
    read(child.stdout);
    read(child.stderr);
    child.on('exit', (code) => done || reject(new Error(`${cmd} exited (${code}) before it was ready:\n${lines.slice(-20).join('\n')}`)));
  });
  started.pid = child.pid;
  return started;
}

// cpuOf is the CPU process pid has used, in µs (/proc/PID/stat's utime and
// stime, in clock ticks of 10 ms).
function cpuOf(pid) {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').replace(/^.*\) /, '').split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10_000;
}

// machineCPU is the CPU every process of the machine has used, the
// kernel's included, in µs (/proc/stat's first line, less idle and iowait).
function machineCPU() {
  const ticks = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1, 9).map(Number);
  return (ticks.reduce((a, b) => a + b, 0) - ticks[3] - ticks[4]) * 10_000;
}

const logged = (msg, field) => (line) => {
  try {
    const l = JSON.parse(line);
    return l.msg === msg ? l[field] : undefined;
  } catch {
    return undefined;
  }
};
const port = (line) => line.startsWith('listening ') ? `http://127.0.0.1:${line.slice(10).trim()}/mcp` : undefined;

const startingLedger = start(opt.ledgerd, ['--data-dir', join(dir, 'ledgerd'), '--listen', '127.0.0.1:0', '--http-listen', '127.0.0.1:0',
  '--admin-listen', ''], procs(opt['ledgerd-procs']), (line) => {
  const grpc = logged('ledgerd listening', 'grpc')(line);
  return grpc && { grpc, http: `http://${JSON.parse(line).http}` };
});
const ledgerURL = await startingLedger;
const guardJS = opt.guard;
const server = join(here, 'server.mjs');
// The guard's ledger client: createLedger's options.
const guardLedger = opt['guard-protocol'] === 'grpc' ? { baseUrl: `http://${ledgerURL.grpc}`, protocol: 'grpc' } : { baseUrl: ledgerURL.http };
const guardEnv = { IDEMLEDGER_GUARD: guardJS, LEDGER_URL: guardLedger.baseUrl, LEDGER_PROTOCOL: guardLedger.protocol ?? '' };

function proxyConfig(name, upstream) {
  const cfg = join(dir, `${name}.yaml`);
  writeFileSync(cfg, [
    'ledger:', `  address: ${ledgerURL.grpc}`,
    'mcp:', '  upstream:', ...upstream.map((l) => `    ${l}`),
    '  tenant:', '    static: acme',
    '  tools:', '    create_invoice: {}', '',
  ].join('\n'));
  return cfg;
}
const proxy = (name, upstream) => start(opt.idemproxy, ['--config', proxyConfig(name, upstream), '--listen', '127.0.0.1:0', '--admin-listen', ''],
  procs(opt['proxy-procs']), logged('idemproxy listening', 'endpoint'));

const [v2Guarded, v1Guarded, v2Plain] = await Promise.all([
  start(process.execPath, [server, '--sdk', 'v2'], guardEnv, port),
  start(process.execPath, [server, '--sdk', 'v1'], guardEnv, port),
  start(process.execPath, [server, '--sdk', 'v2'], {}, port),
]);
const startingProxy = proxy('http', [`url: ${v2Plain}`]);
const httpProxy = await startingProxy;
const stdioConfig = proxyConfig('stdio', [`command: [${JSON.stringify(process.execPath)}, ${JSON.stringify(server)}, --sdk, v2, --stdio]`]);

// A side is one kind of call: how to connect a client, and which tool.
const http = (url) => () => new StreamableHTTPClientTransport(new URL(url));
const stdio = () => new StdioClientTransport({ command: process.execPath, args: [server, '--sdk', 'v2', '--stdio'] });
const stdioProxy = () => new StdioClientTransport({ command: opt.idemproxy, args: ['--config', stdioConfig, '--stdio', '--log-level', 'warn'],
  env: { ...process.env, ...procs(opt['proxy-procs']) } });
// pid names a process whose CPU a call the side reports (idemproxy's), or
// is 'transport': each client's own, the process its transport runs
// (`idemproxy --stdio`).
const side = (transport, tool, era, pid) => ({ transport, tool, era, pid });

const pairs = [];
for (const era of ['2026-07-28', '2025']) {
  pairs.push({ name: `guard v2 ${era}`, target: 'guard', era, base: side(http(v2Guarded), 'echo', era), test: side(http(v2Guarded), 'create_invoice', era) });
  if (era === '2025') {
    pairs.push({ name: `guard v1 ${era}`, target: 'guard', era, base: side(http(v1Guarded), 'echo', era), test: side(http(v1Guarded), 'create_invoice', era) });
  }
  pairs.push({ name: `proxy http ${era}`, target: 'proxy', era, base: side(http(v2Plain), 'create_invoice', era), test: side(http(httpProxy), 'create_invoice', era, startingProxy.pid) });
  pairs.push({ name: `proxy pass-through ${era}`, target: 'info', era, base: side(http(v2Plain), 'echo', era), test: side(http(httpProxy), 'echo', era, startingProxy.pid) });
  pairs.push({ name: `proxy stdio ${era}`, target: 'proxy', era, base: side(stdio, 'create_invoice', era), test: side(stdioProxy, 'create_invoice', era, 'transport') });
  pairs.push({ name: `proxy stdio pass-through ${era}`, target: 'info', era, base: side(stdio, 'echo', era), test: side(stdioProxy, 'echo', era, 'transport') });
}

// connect is a v2 client on era: pinned to 2026-07-28, or the 2025 handshake.
async function connect(s) {
  const client = new Client({ name: 'bench', version: '1.0.0' },
    s.era === '2025' ? {} : { versionNegotiation: { mode: { pin: '2026-07-28' } } });
  const transport = s.transport();
  await client.connect(transport);
  const run = randomUUID();
  let n = 0;
  const call = async () => {
    const res = await client.callTool({ name: s.tool, arguments: { customer: 'c' }, _meta: { 'io.idemledger/idempotency-key': `${run}-${n++}` } });
    if (res.isError) {
      throw new Error(`${s.tool}: ${JSON.stringify(res)}`);
    }
  };
  await call(); // the connection is up and the path warm
  // A 2025 session over HTTP ends with a DELETE (the v2 client's close()
  // sends none).
  return { call, pid: s.pid === 'transport' ? transport.pid : undefined,
    close: async () => { await transport.terminateSession?.(); await client.close(); } };
}

const median = (a) => {
  const s = [...a].sort((x, y) => x - y);
  return s[s.length >> 1];
};

// latency takes turns of block calls on one client a side; p50s in ms.
async function latency(p) {
  const [base, test] = await Promise.all([connect(p.base), connect(p.test)]);
  const times = { base: [], test: [] };
  for (let i = 0; i < 4 * block; i++) {
    await base.call(); // warm-up, not counted: both paths compiled, the connections up
    await test.call();
  }
  while (times.test.length < calls) {
    for (const [k, c] of [['base', base], ['test', test]]) {
      for (let i = 0; i < block; i++) {
        const t0 = performance.now();
        await c.call();
        times[k].push(performance.now() - t0);
      }
    }
  }
  await Promise.all([base.close(), test.close()]);
  return { base: median(times.base), test: median(times.test) };
}

// throughput runs clients concurrent clients a side, seconds at a time in
// turns; calls a second over every round.
async function throughput(p) {
  const total = { base: 0, test: 0 };
  let cpu = 0; // of the test side's processes, over its turns
  const machine = { base: 0, test: 0 }, ledgerd = { base: 0, test: 0 }; // every process's CPU, and ledgerd's, a side
  const sides = { base: await Promise.all(Array.from({ length: clients }, () => connect(p.base))), test: await Promise.all(Array.from({ length: clients }, () => connect(p.test))) };
  for (let r = 0; r < rounds; r++) {
    for (const k of ['base', 'test']) {
      const pids = p[k].pid === 'transport' ? sides[k].map((c) => c.pid) : p[k].pid ? [p[k].pid] : [];
      const cpuOfAll = () => pids.reduce((sum, pid) => sum + cpuOf(pid), 0), cpu0 = cpuOfAll();
      const machine0 = machineCPU(), ledgerd0 = cpuOf(startingLedger.pid);
      const until = performance.now() + seconds * 1000;
      const counts = await Promise.all(sides[k].map(async (c) => {
        let n = 0;
        while (performance.now() < until) {
          await c.call();
          n++;
        }
        return n;
      }));
      total[k] += counts.reduce((a, b) => a + b, 0);
      cpu += cpuOfAll() - cpu0;
      machine[k] += machineCPU() - machine0;
      ledgerd[k] += cpuOf(startingLedger.pid) - ledgerd0;
    }
  }
  await Promise.all([...sides.base, ...sides.test].map((c) => c.close()));
  return {
    base: total.base / (rounds * seconds), test: total.test / (rounds * seconds), cpu: p.test.pid ? cpu / total.test : undefined,
    machine: { base: machine.base / total.base, test: machine.test / total.test }, ledgerd: ledgerd.test / total.test,
  };
}

const rows = [];
for (const p of pairs) {
  if (only.length > 0 && !only.some((o) => p.name.startsWith(o))) continue;
  const lat = await latency(p);
  const tput = await throughput(p);
  const row = {
    name: p.name, target: p.target, era: p.era,
    p50_base_ms: lat.base, p50_test_ms: lat.test, p50_ratio: lat.test / lat.base,
    cps_base: tput.base, cps_test: tput.test, cps_ratio: tput.test / tput.base, proxy_cpu_us_per_call: tput.cpu,
    machine_cpu_us_per_call_base: tput.machine.base, machine_cpu_us_per_call_test: tput.machine.test, ledgerd_cpu_us_per_call: tput.ledgerd,
  };
  rows.push(row);
  const verdict = (ok) => p.target === 'info' ? '' : ok ? ' met' : ' NOT met';
  console.log(`${row.name.padEnd(30)} p50 ${row.p50_base_ms.toFixed(2)} → ${row.p50_test_ms.toFixed(2)} ms  ${row.p50_ratio.toFixed(2)}×${verdict(row.p50_ratio <= 1.3)} (≤ 1.3)` +
    `   ${clients} clients ${row.cps_base.toFixed(0)} → ${row.cps_test.toFixed(0)} calls/s  ${row.cps_ratio.toFixed(2)}×${verdict(row.cps_ratio >= 0.7)} (≥ 0.7)` +
    (tput.cpu === undefined ? '' : `, idemproxy ${tput.cpu.toFixed(0)} µs of CPU a call`) +
    `; the machine's CPU a call ${tput.machine.base.toFixed(0)} → ${tput.machine.test.toFixed(0)} µs, ledgerd's ${tput.ledgerd.toFixed(0)}`);
}

// guardCPU is what the guard itself costs its server: McpGuard's tool
// called in this process (no MCP transport) against ledgerd, --clients
// calls at once for --seconds; calls a second and this process's CPU a
// call (the guard, its ledger client, and the tool's trivial handler).
async function guardCPU() {
  const { createLedger, Guard, McpGuard } = await import(guardJS);
  const ledger = createLedger(guardLedger);
  const tool = new McpGuard(new Guard(ledger), 'acme').tool('create_invoice', async ({ customer }) => ({ content: [{ type: 'text', text: JSON.stringify({ id: 'inv_1', customer }) }] }));
  const run = randomUUID();
  let n = 0;
  const loop = async (until) => {
    while (performance.now() < until) {
      const res = await tool({ customer: 'c' }, { _meta: { 'io.idemledger/idempotency-key': `${run}-${n++}` } });
      if (res.isError) throw new Error(JSON.stringify(res));
    }
  };
  await Promise.all(Array.from({ length: clients }, () => loop(performance.now() + 1000))); // warm-up
  const before = n, cpu = process.cpuUsage(), ledgerd0 = cpuOf(startingLedger.pid), t0 = performance.now();
  await Promise.all(Array.from({ length: clients }, () => loop(t0 + seconds * rounds * 1000)));
  const done = n - before, used = process.cpuUsage(cpu), ledgerd = cpuOf(startingLedger.pid) - ledgerd0;
  ledger.close();
  return { calls_per_s: done / ((performance.now() - t0) / 1000), cpu_us_per_call: (used.user + used.system) / done, ledgerd_cpu_us_per_call: ledgerd / done };
}

let guardInProcess;
if (only.length === 0 || only.includes('guard-cpu')) {
  guardInProcess = await guardCPU();
  console.log(`${'guard in process'.padEnd(30)} ${clients} at once: ${guardInProcess.calls_per_s.toFixed(0)} calls/s, ${guardInProcess.cpu_us_per_call.toFixed(0)} µs of CPU a call (the guard, its ledger client, the handler), ledgerd's ${guardInProcess.ledgerd_cpu_us_per_call.toFixed(0)}`);
}
if (opt.json) {
  writeFileSync(opt.json, JSON.stringify({ calls, block, clients, seconds, rounds, rows, guard_in_process: guardInProcess }, null, 2) + '\n');
}
process.exit(0);
