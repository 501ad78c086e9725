// LedgerService.Stream written to Node's HTTP/2 stream and read from it
// as it arrives, in connect-node's place for this one call: its streaming
// client carries each message through a chain of async iterables and
// waits for one message's write before it writes the next, so a server
// with 32 guarded calls at once made a socket write of each message
// (docs/performance.md). Here a message is an envelope written as it is
// sent (Node's HTTP/2 session writes what a turn of the event loop queued
// together) and each chunk read is decoded where it lands. The connection
// is connect-node's Http2SessionManager's; the headers, the response's
// checks and its errors are connect's own protocol functions, so a
// caller sees the errors connect-node's client gives.
import { constants, type ClientHttp2Stream, type Http2Session, type IncomingHttpHeaders, type SecureClientSessionOptions } from "node:http2";
import net from "node:net";
import type { Duplex } from "node:stream";
import tls from "node:tls";
import { fromBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import * as connectProtocol from "@connectrpc/connect/protocol-connect";
import * as grpcProtocol from "@connectrpc/connect/protocol-grpc";
import { LedgerService, StreamResponseSchema, type StreamResponse } from "./gen/idemledger/v1/ledger_pb.js";

/** Where a stream goes: the connection, the protocol, and the headers a stream carries beside the protocol's (the bearer token). */
export interface StreamEndpoint {
  sessions: Http2SessionManager;
  protocol: "connect" | "grpc";
  headers: Record<string, string>;
  verifying?: boolean; // a verify of the connection is under way
}

const path = `/${LedgerService.typeName}/${LedgerService.method.stream.name}`;
/** An envelope's flag: the Connect protocol's end of the stream, a JSON message. */
const endStream = connectProtocol.endStreamFlag;
/** An envelope's flag: the message is compressed, which the client never asks for. */
const compressed = 0b00000001;
/** The largest message the client takes: a replay carries an outcome, which ledgerd bounds well under this. */
const maxReceivedBytes = 256 << 20;
/**
 * A stream that hears nothing from the ledger for pingAfterMs pings its
 * connection, and a ping not answered within pingTimeoutMs ends the stream
 * UNAVAILABLE and closes the connection, so that the next call connects
 * again: a connection that went silent without closing (a node lost
 * without a reset, a route that drops its packets) is found in 15 s, not
 * when TCP gives up, minutes later. The Go client pings the same, and
 * ledgerd allows a ping every 5 s. Not connect-node's own pings: its
 * manager can emit a session's error after it stopped listening (and throw
 * from a ping on a destroyed session, connect-es#1795), which would end
 * the write service's process.
 */
const pingAfterMs = 10_000;
const pingTimeoutMs = 5_000;
/**
 * A connection to the ledger that is not up, its TLS handshake included,
 * within connectTimeoutMs is given up (UNAVAILABLE), and the next call
 * looks the address up and connects again. Node bounds neither: a
 * connection whose SYNs are dropped (an address whose node is gone, a
 * Service's stale DNS answer) waits for the kernel's retries, about 2 min,
 * and a TLS handshake that gets no answer waits for ever, while every
 * call fails at its deadline. 20 s is gRPC-Go's bound, which the Go client
 * keeps.
 */
const connectTimeoutMs = 20_000;

/** newSessions is the HTTP/2 connection to the ledger at baseUrl that the client's streams and gRPC calls share. */
export function newSessions(baseUrl: string): Http2SessionManager {
  return new Http2SessionManager(baseUrl, undefined, { createConnection: connectWithin });
}

/**
 * verify pings the connection the endpoint's streams and gRPC unary calls
 * share, and closes it when the ping is not answered within pingTimeoutMs,
 * so that the next call connects again: for a unary call that got no
 * answer by its deadline, on a connection that no open stream pings.
 */
export function verify(ep: StreamEndpoint): void {
  if (ep.verifying) {
    return;
  }
  ep.verifying = true;
  ep.sessions.request("POST", path, { ...protocolHeaders[ep.protocol], ...ep.headers }, {}).then((h2) => {
    h2.on("error", () => {}); // closed below, or with its session
    const done = () => {
      ep.verifying = false;
      h2.close(constants.NGHTTP2_CANCEL);
    };
    if (probe(h2.session, done, done) === undefined) {
      done(); // its session closed already: the next call connects again
    }
  }, () => (ep.verifying = false));
}

// probe pings session: answered is called when the ping is answered, or
// fails because the session closed; a ping not answered within
// pingTimeoutMs calls lost, then closes the session without an error,
// which its manager hears as a close: the next call connects again. It
// returns the timer, which a caller may clear, or undefined, calling
// nothing, for a session already closed.
function probe(session: Http2Session | undefined, answered: (ok: boolean) => void, lost: () => void): ReturnType<typeof setTimeout> | undefined {
  if (!session || session.closed || session.destroyed) {
    return undefined;
  }
  const timer = setTimeout(() => {
    lost();
    session.destroy();
  }, pingTimeoutMs);
  timer.unref();
  const settle = (ok: boolean) => {
    clearTimeout(timer);
    answered(ok);
  };
  try {
    session.ping((err) => settle(err === null));
  } catch {
    settle(false); // the session closed under the ping
  }
  return timer;
}

// connectWithin makes the session's socket as Node's http2.connect does
// (TLS with ALPN h2 and the host's name for an https URL) and destroys it
// when it has not connected within connectTimeoutMs.
function connectWithin(authority: URL, options: SecureClientSessionOptions): Duplex {
  const secure = authority.protocol === "https:";
  const host = authority.hostname.replace(/^\[(.*)\]$/, "$1");
  const port = Number(authority.port || (secure ? 443 : 80));
  const socket = secure
    ? tls.connect({ ...options, host, port, ALPNProtocols: ["h2"], servername: options.servername ?? (net.isIP(host) ? undefined : host) })
    : net.connect({ ...options, host, port });
  const timer = setTimeout(() => {
    socket.destroy(Object.assign(new Error(`connect ETIMEDOUT ${authority.host}: not connected within ${connectTimeoutMs} ms`), { code: "ETIMEDOUT" }));
  }, connectTimeoutMs);
  timer.unref();
  socket.once(secure ? "secureConnect" : "connect", () => clearTimeout(timer));
  socket.once("close", () => clearTimeout(timer));
  return socket;
}

/**
 * WireStream is one LedgerService.Stream. send writes a request (sent
 * with the others queued in the same turn), closeSend ends the client's
 * side once they are written, abort ends the stream at once. Each answer
 * goes to onMessage; onEnd is called once, with undefined when the
 * server ended the stream without an error. Neither is called before the
 * constructor returns.
 */
export class WireStream {
  private h2: ClientHttp2Stream | undefined;
  private readonly early: Buffer[] = []; // sent before the stream opened
  private sendClosed = false;
  private done = false;
  private header: Headers | undefined;
  private trailer: Headers | undefined;
  private head: Buffer | undefined; // the first bytes of an envelope, under its 5-byte prefix
  private partial: Buffer | undefined; // an envelope that later chunks fill
  private filled = 0;
  private endSeen = false;
  private lastRead = 0; // Date.now() when the stream last heard from the ledger
  private liveness: ReturnType<typeof setTimeout> | undefined;

  constructor(private readonly ep: StreamEndpoint, private readonly onMessage: (res: StreamResponse) => void,
    private readonly onEnd: (err: ConnectError | undefined) => void) {
    const headers = { ...protocolHeaders[ep.protocol], ...ep.headers };
    ep.sessions.request("POST", path, headers, {}).then((h2) => this.attach(h2), (err: unknown) => this.finish(ConnectError.from(err, Code.Unavailable)));
  }

  /** send writes msg, a StreamRequest's encoding, in an envelope. */
  send(msg: Uint8Array): void {
    if (this.done || this.sendClosed) {
      return;
    }
    const env = Buffer.allocUnsafe(5 + msg.length);
    env[0] = 0;
    env.writeUInt32BE(msg.length, 1);
    env.set(msg, 5);
    if (this.h2) {
      this.h2.write(env);
    } else {
      this.early.push(env);
    }
  }

  closeSend(): void {
    if (this.sendClosed) {
      return;
    }
    this.sendClosed = true;
    this.h2?.end();
  }

  abort(reason: ConnectError): void {
    this.finish(reason);
  }

  private attach(h2: ClientHttp2Stream): void {
    if (this.done) {
      h2.close(constants.NGHTTP2_CANCEL);
      return;
    }
    this.h2 = h2;
    this.heard();
    this.watch(pingAfterMs);
    for (const env of this.early.splice(0)) {
      h2.write(env);
    }
    if (this.sendClosed) {
      h2.end();
    }
    h2.on("response", (headers) => this.response(headers));
    h2.on("data", (chunk: Buffer) => {
      this.heard();
      this.read(chunk);
    });
    h2.on("trailers", (trailers) => (this.trailer = webHeaders(trailers)));
    // A stream aborted (its connection closed under it: a ledgerd killed or
    // restarted, a reset on the way) ends without its end: it is judged at
    // its close, after any error that says more.
    h2.on("end", () => h2.aborted || this.finish(this.outcome()));
    // An error while writing after the server ended the stream is not the stream's
    // error: its end says what happened (connect-node does the same).
    h2.on("error", (err: Error & { code?: string }) => {
      if (err.code !== "ERR_STREAM_WRITE_AFTER_END") {
        this.finish(ConnectError.from(err, Code.Unavailable));
      }
    });
    h2.on("close", () => this.finish(closeError(h2)));
  }

  private heard(): void {
    this.lastRead = Date.now();
  }

  // watch pings the connection once the stream has heard nothing for
  // pingAfterMs, looking again in ms.
  private watch(ms: number): void {
    this.liveness = setTimeout(() => {
      const quiet = Date.now() - this.lastRead;
      if (quiet < pingAfterMs) {
        this.watch(pingAfterMs - quiet);
        return;
      }
      this.ping();
    }, ms);
    this.liveness.unref?.();
  }

  // ping probes the stream's connection: an answer starts the watch again;
  // a session that closed under the ping ends the stream on its own.
  private ping(): void {
    if (this.done) {
      return;
    }
    this.liveness = probe(this.h2?.session, (ok) => {
      if (ok && !this.done) {
        this.heard();
        this.watch(pingAfterMs);
      }
    }, () => this.finish(new ConnectError(`the ledger's connection did not answer a ping within ${pingTimeoutMs} ms: it is lost`, Code.Unavailable)));
  }

  private response(headers: IncomingHttpHeaders): void {
    const status = Number(headers[":status"]);
    this.header = webHeaders(headers);
    try {
      if (this.ep.protocol === "connect") {
        connectProtocol.validateResponse("bidi_streaming", true, status, this.header);
        return;
      }
      const { headerError } = grpcProtocol.validateResponse(status, this.header);
      if (headerError) {
        throw headerError;
      }
    } catch (err) {
      this.finish(ConnectError.from(err));
    }
  }

  // read decodes every whole envelope that chunk ends or holds, and keeps
  // the start of the next: under 5 bytes as they are, else in a buffer of
  // the envelope's size that the chunks after it fill.
  private read(chunk: Buffer): void {
    if (this.done) {
      return;
    }
    if (this.partial) {
      const n = Math.min(this.partial.length - this.filled, chunk.length);
      chunk.copy(this.partial, this.filled, 0, n);
      this.filled += n;
      if (this.filled < this.partial.length) {
        return;
      }
      const env = this.partial;
      this.partial = undefined;
      this.envelope(env);
      chunk = chunk.subarray(n);
    } else if (this.head) {
      chunk = Buffer.concat([this.head, chunk]);
      this.head = undefined;
    }
    while (!this.done && chunk.length >= 5) {
      const size = 5 + chunk.readUInt32BE(1);
      if (chunk.length < size) {
        break;
      }
      this.envelope(chunk.subarray(0, size));
      chunk = chunk.subarray(size);
    }
    if (this.done || chunk.length === 0) {
      return;
    }
    if (chunk.length < 5) {
      this.head = Buffer.from(chunk);
      return;
    }
    const size = 5 + chunk.readUInt32BE(1);
    if (size > maxReceivedBytes) {
      this.finish(new ConnectError(`the ledger sent a message of ${size} bytes, over the client's limit of ${maxReceivedBytes}`, Code.ResourceExhausted));
      return;
    }
    this.partial = Buffer.allocUnsafe(size);
    this.filled = chunk.copy(this.partial);
  }

  // envelope hands on one message, or ends the stream at its end message.
  private envelope(env: Buffer): void {
    const flags = env[0];
    // A plain Uint8Array view: bytes fields decode as views of what they are given, and a caller gets Uint8Arrays, not Buffers.
    const data = new Uint8Array(env.buffer, env.byteOffset + 5, env.length - 5);
    if (flags & compressed) {
      this.finish(new ConnectError("the ledger sent a compressed message, which the client did not ask for", Code.Internal));
      return;
    }
    if (flags & endStream) {
      this.endSeen = true;
      const { error } = connectProtocol.endStreamFromJson(data);
      if (error) {
        this.finish(error);
      }
      return;
    }
    let res: StreamResponse;
    try {
      res = fromBinary(StreamResponseSchema, data);
    } catch (err) {
      this.finish(new ConnectError(`the ledger sent a message that does not decode: ${String(err)}`, Code.Internal));
      return;
    }
    this.onMessage(res);
  }

  // outcome is how a stream whose server ended it ended: undefined when it ended without an error.
  private outcome(): ConnectError | undefined {
    if (this.head || this.partial) {
      return new ConnectError("the ledger's stream ended inside a message", Code.Internal);
    }
    if (this.ep.protocol === "connect") {
      return this.endSeen ? undefined : new ConnectError("the ledger's stream ended without its end message", Code.Internal);
    }
    try {
      grpcProtocol.validateTrailer(this.trailer ?? new Headers(), this.header ?? new Headers());
      return undefined;
    } catch (err) {
      return ConnectError.from(err);
    }
  }

  private finish(err: ConnectError | undefined): void {
    if (this.done) {
      return;
    }
    this.done = true;
    clearTimeout(this.liveness);
    this.early.length = 0;
    if (this.h2 && !this.h2.closed) {
      this.h2.close(err ? constants.NGHTTP2_CANCEL : constants.NGHTTP2_NO_ERROR);
    }
    this.onEnd(err);
  }
}

// The protocols' request headers, as connect-node's transports send them.
const protocolHeaders = {
  connect: nodeHeaders(connectProtocol.requestHeader("bidi_streaming", true, undefined, undefined, true)),
  grpc: nodeHeaders(grpcProtocol.requestHeader(true, undefined, undefined)),
};

function nodeHeaders(h: Headers): Record<string, string> {
  const out: Record<string, string> = {};
  h.forEach((v, k) => (out[k] = v));
  return out;
}

function webHeaders(h: IncomingHttpHeaders): Headers {
  const out = new Headers();
  for (const [k, v] of Object.entries(h)) {
    if (k.startsWith(":") || v === undefined) {
      continue;
    }
    for (const e of Array.isArray(v) ? v : [String(v)]) {
      out.append(k, e);
    }
  }
  return out;
}

// closeError is the error of a stream that closed before it ended. One
// that its connection's close aborted (Node cancels the streams of a
// connection that closes) was cut off: UNAVAILABLE, as gRPC has a broken
// connection; its calls may have run.
function closeError(h2: ClientHttp2Stream): ConnectError {
  if (h2.aborted && h2.rstCode === constants.NGHTTP2_CANCEL) {
    return new ConnectError("the ledger's connection closed under the stream", Code.Unavailable);
  }
  return resetError(h2.rstCode) ?? new ConnectError("the ledger's stream closed before it ended", Code.Unavailable);
}

// resetError is what an HTTP/2 reset says, as gRPC maps its codes; undefined for none.
function resetError(rstCode: number): ConnectError | undefined {
  const msg = `the ledger's stream was reset (HTTP/2 code ${rstCode})`;
  switch (rstCode) {
    case constants.NGHTTP2_NO_ERROR:
    case constants.NGHTTP2_STREAM_CLOSED:
      return undefined;
    case constants.NGHTTP2_REFUSED_STREAM:
      return new ConnectError(msg, Code.Unavailable);
    case constants.NGHTTP2_CANCEL:
      return new ConnectError(msg, Code.Canceled);
    case constants.NGHTTP2_ENHANCE_YOUR_CALM:
      return new ConnectError(msg, Code.ResourceExhausted);
    case constants.NGHTTP2_INADEQUATE_SECURITY:
    case constants.NGHTTP2_HTTP_1_1_REQUIRED:
      return new ConnectError(msg, Code.PermissionDenied);
    default:
      return new ConnectError(msg, Code.Internal);
  }
}
