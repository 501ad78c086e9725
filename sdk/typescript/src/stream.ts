// The ledger's calls over one LedgerService.Stream, as ledgerclient does
// in Go: a call is a message each way on a stream that stays open, not a
// request of its own, which halves what a guarded call adds
// (docs/performance.md). Each call is answered exactly as its unary
// counterpart, typed errors and their details included.
import { create, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type CallOptions, type Client } from "@connectrpc/connect";
import {
  type LedgerService, StreamRequestSchema,
  type BeginRequestSchema, type BeginResponse, type CompleteRequestSchema, type CompleteResponse, type ExtendRequestSchema, type ExtendResponse,
  type LookupRequestSchema, type LookupResponse, type ReleaseRequestSchema, type ReleaseResponse, type ResolveRequestSchema, type ResolveResponse,
  type StreamRequest, type StreamResponse,
} from "./gen/idemledger/v1/ledger_pb.js";
import { ErrorDetailSchema } from "./gen/idemledger/v1/errors_pb.js";
import { LedgerError } from "./errors.js";
import { sizeBound } from "./size.js";
import { verify, WireStream, type StreamEndpoint } from "./wire.js";

/** The calls a write service makes, each as its unary counterpart answers it. */
export interface LedgerCalls {
  begin(req: MessageInitShape<typeof BeginRequestSchema>, opts?: CallOptions): Promise<BeginResponse>;
  complete(req: MessageInitShape<typeof CompleteRequestSchema>, opts?: CallOptions): Promise<CompleteResponse>;
  release(req: MessageInitShape<typeof ReleaseRequestSchema>, opts?: CallOptions): Promise<ReleaseResponse>;
  extend(req: MessageInitShape<typeof ExtendRequestSchema>, opts?: CallOptions): Promise<ExtendResponse>;
  lookup(req: MessageInitShape<typeof LookupRequestSchema>, opts?: CallOptions): Promise<LookupResponse>;
  resolve(req: MessageInitShape<typeof ResolveRequestSchema>, opts?: CallOptions): Promise<ResolveResponse>;
}

/** A request larger than this goes as a unary call, so that one over the server's limit fails alone. */
export const maxStreamedBytes = 64 << 10;

/** How long a stream without calls in flight stays open: a process whose last call is done exits this long after it, or at once after close(). */
const idleMs = 1_000;

type Kind = keyof LedgerCalls;

/** A call in flight: what it is, and how it is answered. */
interface Pending {
  kind: Kind;
  init: object;
  opts: CallOptions;
  resolve(res: unknown): void;
  reject(err: unknown): void;
}

/** One stream and its calls in flight. */
class Session {
  readonly pending = new Map<bigint, Pending>();
  wire!: WireStream;
  ended = false;

  /** end takes the calls in flight off the stream, for failing or sending again. */
  end(): Pending[] {
    this.ended = true;
    const calls = [...this.pending.values()];
    this.pending.clear();
    return calls;
  }
}

/**
 * StreamLedger sends Begin, Complete, Release, Extend, Lookup and Resolve
 * over one LedgerService.Stream (a WireStream), opened when first needed, opened
 * again after it ends, and closed after a second without calls (so that
 * it keeps no process alive). Differences a caller may notice:
 *   - the call's timeoutMs travels as the call's timeout, and its signal
 *     cancels it on the server;
 *   - headers are the stream's (the endpoint's), not the call's;
 *   - calls in flight when the stream breaks fail UNAVAILABLE: they may
 *     have run, as a unary call cut off by a broken connection may have;
 *   - a baseUrl that does not speak HTTP/2 (a proxy of HTTP/1.1 only) gets
 *     every call as a unary call of unary, from the first on.
 */
export class StreamLedger implements LedgerCalls {
  private cur: Session | undefined;
  private ids = 0n;
  private idle: ReturnType<typeof setTimeout> | undefined;
  private closed = false;
  private http1 = false;

  /**
   * endpoint is where the streams go; unary takes the calls too large for
   * one, and every call when the endpoint does not speak HTTP/2; defaultTimeoutMs
   * bounds a call that sets no timeoutMs (0: none); failed maps what
   * ended a stream to what its calls fail with.
   */
  constructor(private readonly endpoint: StreamEndpoint, private readonly unary: Client<typeof LedgerService>,
    private readonly defaultTimeoutMs: number, private readonly failed: (err: unknown, method: string) => unknown = (err) => err) {}

  readonly begin = this.method("begin");
  readonly complete = this.method("complete");
  readonly release = this.method("release");
  readonly extend = this.method("extend");
  readonly lookup = this.method("lookup");
  readonly resolve = this.method("resolve");

  /** method is the LedgerCalls method kind: a call on the stream. */
  private method<K extends Kind>(kind: K): LedgerCalls[K] {
    return ((req: object, opts?: CallOptions) => this.call(kind, req, opts)) as LedgerCalls[K];
  }

  /** close ends the stream: calls in flight fail UNAVAILABLE, later calls at once. */
  close(): void {
    this.closed = true;
    clearTimeout(this.idle);
    this.cur?.wire.abort(new ConnectError("the ledger client is closed", Code.Unavailable));
    this.endpoint.sessions.abort();
  }

  private call(kind: Kind, init: object, opts: CallOptions = {}): Promise<unknown> {
    if (this.closed) {
      return Promise.reject(new ConnectError("the ledger client is closed", Code.Unavailable));
    }
    const timeoutMs = opts.timeoutMs ?? this.defaultTimeoutMs;
    const req = create(StreamRequestSchema, { call: { case: kind, value: init } } as MessageInitShape<typeof StreamRequestSchema>);
    // Only a call that carries an outcome can be large, and only one whose
    // bound is over the limit is encoded to tell: the others are encoded once.
    const large = (kind === "complete" || kind === "resolve") && sizeBound(req) > maxStreamedBytes && encodedSize(req) > maxStreamedBytes;
    if (this.http1 || large) {
      return this.callUnary(kind, init, opts);
    }
    if (opts.signal?.aborted) {
      return Promise.reject(ConnectError.from(opts.signal.reason, Code.Canceled));
    }
    if (timeoutMs > 0) {
      req.timeout = durationFromMs(timeoutMs);
    }
    req.id = ++this.ids;
    const msg = encoded(kind, req);
    if (msg instanceof ConnectError) {
      return Promise.reject(msg); // a request that cannot be encoded fails alone, before it touches the stream
    }
    const s = this.session();
    clearTimeout(this.idle);
    return new Promise<unknown>((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const giveUp = (err: ConnectError) => {
        if (s.pending.delete(req.id)) {
          s.wire.send(toBinary(StreamRequestSchema, create(StreamRequestSchema, { id: req.id, call: { case: "cancel", value: {} } })));
          done();
          reject(err);
        }
      };
      const onAbort = () => giveUp(ConnectError.from(opts.signal!.reason, Code.Canceled));
      const done = () => {
        clearTimeout(timer);
        opts.signal?.removeEventListener("abort", onAbort);
        if (s.pending.size === 0 && s === this.cur) {
          this.idle = setTimeout(() => this.retire(s), idleMs);
          this.idle.unref?.();
        }
      };
      s.pending.set(req.id, {
        kind, init, opts,
        resolve: (res) => { done(); resolve(res); },
        reject: (err) => { done(); reject(err); },
      });
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      if (timeoutMs > 0) {
        // The server ends the call at its timeout; this is for a server that does not answer at all.
        timer = setTimeout(() => giveUp(new ConnectError("the call's deadline passed", Code.DeadlineExceeded)), timeoutMs);
      }
      s.wire.send(msg);
    });
  }

  private callUnary(kind: Kind, init: object, opts: CallOptions): Promise<unknown> {
    return (this.unary[kind] as (r: object, o: CallOptions) => Promise<unknown>)(init, { ...opts, timeoutMs: opts.timeoutMs ?? this.defaultTimeoutMs })
      .catch((err: unknown) => {
        if (this.endpoint.protocol === "grpc" && ConnectError.from(err).code === Code.DeadlineExceeded) {
          verify(this.endpoint); // no answer in time: the shared connection may be lost
        }
        throw cutOff(err, opts.signal) ?? err;
      });
  }

  // session is the open stream, opened when there is none.
  private session(): Session {
    if (this.cur && !this.cur.ended) {
      return this.cur;
    }
    const s = new Session();
    s.wire = new WireStream(this.endpoint, (res) => {
      // The answers ready together, each as if it came alone.
      const more = res.more;
      res.more = [];
      this.deliver(s, res);
      for (const a of more) {
        this.deliver(s, a);
      }
    }, (err) => this.ended(s, err));
    this.cur = s;
    return s;
  }

  // deliver answers the call that res answers.
  private deliver(s: Session, res: StreamResponse): void {
    if (res.result.case === "drain") {
      this.retire(s); // calls already sent are answered; new ones go on a new stream
      return;
    }
    const p = s.pending.get(res.id);
    s.pending.delete(res.id);
    if (p) {
      try {
        p.resolve(answer(p.kind, res));
      } catch (e) {
        p.reject(e);
      }
    }
  }

  // ended fails the calls s leaves unanswered, or sends them again as unary calls where the endpoint does not speak HTTP/2.
  private ended(s: Session, err = new ConnectError("the ledger ended the stream", Code.Unavailable)): void {
    if (this.cur === s) {
      this.cur = undefined;
    }
    if (notHTTP2(err)) {
      // Nothing was served on s: its calls go again, as unary calls.
      this.http1 = true;
      for (const p of s.end()) {
        this.callUnary(p.kind, p.init, p.opts).then(p.resolve, p.reject);
      }
      return;
    }
    const failure = this.failed(err, "Stream");
    for (const p of s.end()) {
      p.reject(failure);
    }
  }

  // retire sends no more calls on s: it closes once its calls are answered.
  private retire(s: Session): void {
    if (this.cur === s) {
      this.cur = undefined;
    }
    s.wire.closeSend();
  }
}

// cutOff is the UNAVAILABLE error of a unary call whose connection failed
// under it (reset, closed, a broken pipe: a ledgerd killed or restarted),
// which connect-node reports as ABORTED, CANCELED ("stream closed with
// error code CANCEL") or INTERNAL ("write EPIPE"), where a call on the
// stream, and gRPC, say UNAVAILABLE: retryable, the call may have run. A
// cancel of the caller's own and the ledger's answers stay what they are.
function cutOff(err: unknown, signal: AbortSignal | undefined): ConnectError | undefined {
  if (signal?.aborted || !(err instanceof ConnectError) || err.cause instanceof LedgerError || err.findDetails(ErrorDetailSchema).length > 0) {
    return undefined;
  }
  let broken = err.code === Code.Aborted || err.code === Code.Canceled;
  for (let e = err.cause, depth = 0; err.code === Code.Internal && e instanceof Error && depth < 8; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    broken ||= typeof code === "string" && /^E[A-Z]+$/.test(code); // a system error: EPIPE, ECONNRESET
  }
  return broken ? new ConnectError(`the ledger's connection failed under the call: ${err.rawMessage}`, Code.Unavailable, undefined, undefined, err) : undefined;
}

// notHTTP2 says err comes of an endpoint that answered HTTP/2's preface in HTTP/1.1.
function notHTTP2(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if ((e as { code?: unknown }).code === "ERR_HTTP2_ERROR") {
      return true;
    }
  }
  return false;
}

// encoded is req's encoding, or the INVALID_ARGUMENT error of a request
// that cannot be encoded (a uint64 below zero).
function encoded(kind: Kind, req: StreamRequest): Uint8Array | ConnectError {
  try {
    return toBinary(StreamRequestSchema, req);
  } catch (err) {
    return new ConnectError(`the ${kind} request cannot be encoded: ${err instanceof Error ? err.message : String(err)}`, Code.InvalidArgument);
  }
}

// encodedSize is the length of req's encoding; 0 when it cannot be encoded (encoded says why).
function encodedSize(req: StreamRequest): number {
  try {
    return toBinary(StreamRequestSchema, req).length;
  } catch {
    return 0;
  }
}

// answer is the response of kind from res, or the error it carries.
function answer(kind: Kind, res: StreamResponse): unknown {
  const r = res.result;
  if (r.case === "error") {
    const err = new ConnectError(r.value.message, r.value.code === 0 ? Code.Unknown : (r.value.code as Code));
    err.details.push(...r.value.details.map((a) => ({ type: a.typeUrl.slice(a.typeUrl.lastIndexOf("/") + 1), value: a.value })));
    throw err;
  }
  if (r.case !== kind) {
    throw new ConnectError(`the ledger answered ${kind} with ${r.case}`, Code.Internal);
  }
  return r.value;
}
