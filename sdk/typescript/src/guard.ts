// The guard: a call runs under the ledger at most once per key, as
// interceptors/guard does in Go. Begin claims the key or replays its
// stored outcome; the run goes on under the claim, its lease extended
// every half lease; its outcome is completed (or, when transient,
// released) whatever became of its caller.
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { anyUnpack, type Any, durationFromMs, timestampFromMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { ConnectError, Code } from "@connectrpc/connect";
import { ErrorCode, ErrorDetailSchema } from "./gen/idemledger/v1/errors_pb.js";
import { BeginRequestSchema, OnLeaseExpiry, OutcomeSchema, type BeginRequest, type Claim as WireClaim, type Outcome as WireOutcome } from "./gen/idemledger/v1/ledger_pb.js";
import { codeName, LedgerError, ledgerError } from "./errors.js";
import { FencedRun, withFence, type FenceRow, type FenceTable } from "./fence.js";
import type { Ledger } from "./ledger.js";
import { sizeBound } from "./size.js";

/** What a duplicate does while the first attempt runs: wait for its answer, or get IN_PROGRESS at once. */
export type OnInProgress = "wait" | "reject";
/** What Begin does with an attempt whose lease ran out: take over (run again, with a higher token), or hold (OUTCOME_UNKNOWN). */
export type OnLeaseExpiryPolicy = "takeover" | "hold";

/** The policy of a guarded call, as guard.Policy in Go. */
export interface Policy {
  leaseMs?: number;
  retentionMs?: number;
  tombstoneRetentionMs?: number;
  noTombstones?: boolean;
  /** A call without a key runs unprotected instead of KEY_MISSING. */
  keyOptional?: boolean;
  onInProgress?: OnInProgress;
  /** How long a duplicate waits under "wait" (10 s when absent). */
  maxWaitMs?: number;
  onLeaseExpiry?: OnLeaseExpiryPolicy;
  /** How long a run may go on, outliving its caller (1 min when absent); past it its outcome is unknown. */
  runTimeoutMs?: number;
  /**
   * The fence table of the database the write lands in: the run writes
   * its key's fence in its write's transaction (writeFence), and no crash
   * leaves a second effect or an unknown outcome. A fenced call takes
   * "takeover" and no reconcile function.
   */
  fence?: FenceTable;
}

/** One call under the guard. */
export interface Call {
  tenant: string;
  key: string;
  fingerprint: string;
  method: string;
  policy: Policy;
  /** Where the key came from, for the record's readers: "argument", "parameter", "meta", "host:<_meta key>", "header". */
  keySource?: string;
  /** Asked on a takeover whether the earlier attempt applied: its outcome if it did, undefined if it did not. */
  reconcile?: (signal: AbortSignal) => Promise<Outcome | undefined>;
  /** Turns what a fenced handler hands writeFence into the outcome the adapter stores; absent, it must be an Outcome. */
  encode?: (result: unknown) => Outcome;
}

/** The claim a run goes on under: its fencing token and attempt. */
export interface Claim {
  token: bigint;
  attempt: number;
  leaseExpiresAtMs: number;
}

/** A run's outcome: a response to store, or a stored error status; transient releases the key instead. */
export interface Outcome {
  response?: Any;
  status?: { code: number; message: string; details: Any[] };
  transient?: boolean;
}

/** What the guard answers: the outcome, whether it is a replay, whether it ran under a claim, whether it is the one the run's fence holds (answer from it, not from the handler's own result). */
export interface Result {
  outcome: Outcome;
  replayed: boolean;
  protected: boolean;
  fenced: boolean;
}

/** The run: it gets its claim (undefined when unprotected) and a signal that ends at the run timeout or a lost lease. */
export type Run = (claim: Claim | undefined, signal: AbortSignal) => Promise<Outcome>;

/** A run that throws this (or an error whose cause is one) does not know whether it did its write. */
export class OutcomeUnknownError extends Error {
  constructor(message = "the outcome is unknown", opts?: { cause?: unknown }) {
    super(message, opts);
    this.name = "OutcomeUnknownError";
  }
}

export interface GuardOptions {
  /** The largest outcome kept (1 MiB when absent); a larger one is stored as OUTCOME_TOO_LARGE. */
  maxOutcomeBytes?: number;
  /**
   * How long Complete and Release are tried again, while the ledger answers
   * a retryable error, from the start of the first try (20 s when absent);
   * each try has the ledger's timeoutMs. A ledger that is down (restarting,
   * say) fails each try at once, and tries go on, at most 1 s apart, until
   * it is back; a connection that goes silent without closing (a ledgerd's
   * node lost) fails them for up to 15 s until the ledger client finds it
   * lost, so keep it above 15 s plus a timeoutMs.
   */
  completeWithinMs?: number;
}

const defaultRunTimeoutMs = 60_000;
const defaultMaxWaitMs = 10_000;
const maxLookupWaitMs = 5_000;

/** Guard runs calls under the ledger. */
export class Guard {
  readonly ledger: Ledger;
  private readonly maxOutcomeBytes: number;
  private readonly completeWithinMs: number;

  constructor(ledger: Ledger, opts: GuardOptions = {}) {
    this.ledger = ledger;
    this.maxOutcomeBytes = opts.maxOutcomeBytes ?? 1 << 20;
    this.completeWithinMs = opts.completeWithinMs ?? 20_000;
  }

  /**
   * do runs call under the ledger: run is called at most once, and only
   * under a claim (or, for a call without a key whose policy makes the
   * key optional, unprotected). It throws LedgerError.
   */
  async do(call: Call, run: Run, signal?: AbortSignal): Promise<Result> {
    if (call.key === "") {
      if (call.policy.keyOptional) {
        return { outcome: await run(undefined, AbortSignal.timeout(call.policy.runTimeoutMs ?? defaultRunTimeoutMs)), replayed: false, protected: false, fenced: false };
      }
      throw new LedgerError(ErrorCode.KEY_MISSING, "the call has no idempotency key");
    }
    if (call.tenant === "") {
      throw new LedgerError(ErrorCode.VALIDATION_FAILED, "the call names no tenant");
    }
    if (call.policy.fence && (call.reconcile || call.policy.onLeaseExpiry === "hold")) {
      throw new LedgerError(ErrorCode.INTERNAL, "internal error: a fenced call takes no reconcile function and no hold, its fence says whether an earlier attempt committed");
    }
    const req = begin(call);
    const waitUntil = Date.now() + (call.policy.maxWaitMs ?? defaultMaxWaitMs);
    for (;;) {
      let res;
      try {
        res = await this.ledger.begin(req, { signal });
      } catch (err) {
        const le = beginError(err);
        if (le.code !== ErrorCode.IN_PROGRESS || (call.policy.onInProgress ?? "wait") !== "wait" || !(await this.wait(call, le, waitUntil, signal))) {
          throw le;
        }
        continue;
      }
      switch (res.result.case) {
        case "replay":
          return { outcome: fromWire(res.result.value.outcome), replayed: true, protected: true, fenced: false };
        case "claim": {
          const c = res.result.value;
          const lease = c.leaseExpiresAt ? timestampMs(c.leaseExpiresAt) : Date.now();
          return this.run(call, { token: c.token, attempt: c.attempt, leaseExpiresAtMs: lease }, c, run);
        }
      }
      throw new LedgerError(ErrorCode.INTERNAL, "the ledger's answer to Begin is neither a claim nor a replay");
    }
  }

  // wait waits for the record behind an IN_PROGRESS to change (Lookup with
  // a wait); false when the bound is reached: the duplicate gets
  // IN_PROGRESS. A ledger that is shutting down ends the wait with its
  // UNAVAILABLE.
  private async wait(call: Call, inProgress: LedgerError, until: number, signal?: AbortSignal): Promise<boolean> {
    const left = until - Date.now();
    if (left <= 0 || signal?.aborted) {
      return false;
    }
    let w = Math.min(left, maxLookupWaitMs);
    const end = Date.parse(inProgress.metadata.leaseExpiresAt ?? "");
    if (!Number.isNaN(end)) {
      w = Math.min(w, end - Date.now() + 5);
    } else if (inProgress.retryAfterMs > 0) {
      w = Math.min(w, inProgress.retryAfterMs);
    }
    if (w <= 0) {
      return true; // the lease ran out: Begin takes over
    }
    try {
      await this.ledger.lookup({ tenant: call.tenant, key: call.key, wait: durationFromMs(w) }, { signal, timeoutMs: w + 5_000 });
    } catch (err) {
      const le = ledgerError(err);
      if (le?.code === ErrorCode.UNAVAILABLE && le.metadata.cause === "shutdown") {
        throw new LedgerError(ErrorCode.UNAVAILABLE, "the idempotency ledger instance is shutting down", { retryAfterMs: Math.max(le.retryAfterMs, 1000), metadata: { cause: "shutdown" } });
      }
      if (le?.code !== ErrorCode.NOT_FOUND) {
        // The ledger cannot wait for us: Begin again after a short pause.
        await sleep(Math.min(until - Date.now(), Math.random() * 500), signal);
      }
    }
    return !signal?.aborted && Date.now() < until;
  }

  // run runs the call under claim c and records its outcome. The run
  // outlives its caller: its signal ends only at the run timeout or when
  // another attempt took over.
  private async run(call: Call, c: Claim, wire: WireClaim, run: Run): Promise<Result> {
    const runTimeout = call.policy.runTimeoutMs ?? defaultRunTimeoutMs;
    const ctl = new AbortController();
    const timer = setTimeout(() => ctl.abort(new OutcomeUnknownError("the run timed out")), runTimeout);
    const stop = this.keepAlive(call, c, ctl);
    const fenced = call.policy.fence && this.fencedRun(call, c, wire);
    try {
      if (c.attempt > 1 && call.reconcile) {
        let earlier: Outcome | undefined;
        try {
          earlier = await call.reconcile(ctl.signal);
        } catch (err) {
          throw new LedgerError(ErrorCode.UNAVAILABLE, "cannot tell yet whether an earlier attempt of this call applied",
            { retryAfterMs: Math.max(100, c.leaseExpiresAtMs - Date.now()), cause: err });
        }
        if (earlier) {
          await this.complete(c, call, earlier);
          return { outcome: earlier, replayed: true, protected: true, fenced: false };
        }
      }
      if (c.attempt > 1 && fenced) {
        // A takeover reserves the fence before it runs: an earlier attempt
        // that committed left its outcome there, and a later commit of an
        // earlier attempt now fails.
        let row: FenceRow;
        try {
          row = await call.policy.fence!.reserve(fenced.scope, c.token);
        } catch (err) {
          throw new LedgerError(ErrorCode.UNAVAILABLE, "cannot tell yet whether an earlier attempt of this call committed",
            { retryAfterMs: Math.max(100, c.leaseExpiresAtMs - Date.now()), cause: err });
        }
        switch (verdict(row, fenced.scope, c.token)) {
          case "committed": {
            const earlier = fromFence(row.outcome!);
            await this.complete(c, call, earlier);
            return { outcome: earlier, replayed: true, protected: true, fenced: false };
          }
          case "taken":
            throw takenOver();
        }
      }
      let out: Outcome | undefined;
      let failure: unknown;
      try {
        out = fenced ? await withFence(fenced, () => run(c, ctl.signal)) : await run(c, ctl.signal);
      } catch (err) {
        failure = err;
      }
      if (fenced?.attempted) {
        const answer = await this.settle(call, c, fenced, out, failure);
        if (answer) {
          return answer;
        }
        if (fenced.written && (ctl.signal.aborted || isUnknown(failure))) {
          // Known now: the write did not commit, and cannot.
          await this.record(() => this.ledger.release({ tenant: call.tenant, key: call.key, token: c.token }));
          throw new LedgerError(ErrorCode.UNAVAILABLE, "the write did not commit, and its fence now keeps it from committing: retry with the same key", { retryAfterMs: 100, cause: failure });
        }
      }
      if (failure !== undefined) {
        if (ctl.signal.aborted || isUnknown(failure)) {
          const timedOut = ctl.signal.reason instanceof OutcomeUnknownError;
          throw new LedgerError(ErrorCode.UNAVAILABLE, timedOut
            ? `the service's handler did not finish within its run timeout (${runTimeout} ms), so nobody knows whether this call was done: retry with the same key once its lease has run out`
            : "the service's handler could not tell whether this call was done: retry with the same key once its lease has run out",
          { retryAfterMs: Math.max(100, c.leaseExpiresAtMs - Date.now()), cause: failure });
        }
        throw failure;
      }
      if (out!.transient) {
        await this.record(() => this.ledger.release({ tenant: call.tenant, key: call.key, token: c.token }));
        return { outcome: out!, replayed: false, protected: true, fenced: false };
      }
      await this.complete(c, call, out!);
      return { outcome: out!, replayed: false, protected: true, fenced: false };
    } finally {
      clearTimeout(timer);
      stop();
    }
  }

  // fencedRun is the fencing of claim c of call: its scope, and its
  // encoding of what the handler hands writeFence, as the ledger stores it.
  private fencedRun(call: Call, c: Claim, wire: WireClaim): FencedRun {
    const lease = call.policy.leaseMs ?? Math.max(0, c.leaseExpiresAtMs - Date.now());
    const created = wire.createdAt ? wire.createdAt.seconds * 1_000_000n + BigInt(Math.floor(wire.createdAt.nanos / 1000)) : 0n;
    const expires = Math.max(wire.expiresAt ? timestampMs(wire.expiresAt) : 0, c.leaseExpiresAtMs);
    const scope = { namespace: wire.namespace, tenant: call.tenant, key: call.key, method: call.method, createdUs: created, expiresAt: new Date(expires) };
    const encode = (result: unknown): Uint8Array => {
      const out = call.encode ? call.encode(result) : (result as Outcome);
      if (!out || out.transient || (!out.response && !out.status)) {
        throw new LedgerError(ErrorCode.INTERNAL, "a fence holds an outcome to store, not a transient or empty one, so the write does not commit");
      }
      const bytes = toBinary(OutcomeSchema, toWire(out));
      return bytes.length > this.maxOutcomeBytes ? toBinary(OutcomeSchema, notKept(ErrorCode.OUTCOME_TOO_LARGE, bytes.length, this.maxOutcomeBytes)) : bytes;
    };
    return new FencedRun(scope, c.token, encode, () => new Date(Math.max(expires, Date.now() + lease)));
  }

  // settle decides a fenced run that wrote or was refused its fence. One
  // that answered a response committed it: the key is completed with the
  // fenced outcome. Any other closes the fence to its own token and reads
  // it: committed, the fenced outcome answers; a run the fence refused
  // lost its key; otherwise (undefined) the run's own answer stands.
  private async settle(call: Call, c: Claim, fenced: FencedRun, out: Outcome | undefined, failure: unknown): Promise<Result | undefined> {
    if (failure === undefined && out && !out.transient && out.response && fenced.written) {
      const answer = fromFence(fenced.written);
      await this.complete(c, call, answer);
      return { outcome: answer, replayed: false, protected: true, fenced: true };
    }
    // Read again for completeWithinMs: the failure that ended the run may
    // be its database's, failing over.
    let row: FenceRow | undefined;
    const err = await this.persist(async () => {
      row = await call.policy.fence!.reserve(fenced.scope, c.token + 1n);
    }, () => [true, 0]);
    if (row === undefined) {
      throw new LedgerError(ErrorCode.UNAVAILABLE, "the service's handler failed, and its fence cannot say whether its write committed: retry with the same key once its lease has run out",
        { retryAfterMs: Math.max(100, c.leaseExpiresAtMs - Date.now()), cause: err });
    }
    if (verdict(row, fenced.scope, c.token + 1n) === "committed") {
      const answer = fromFence(row.outcome!);
      await this.complete(c, call, answer);
      return { outcome: answer, replayed: false, protected: true, fenced: true };
    }
    if (!fenced.written) {
      throw takenOver();
    }
    return undefined;
  }

  // complete stores the outcome; one the ledger cannot keep is replaced by
  // a small stored error that says the call ran.
  private async complete(c: Claim, call: Call, out: Outcome): Promise<void> {
    const wire = toWire(out);
    // Encoded only when it may be over the limit: most outcomes are far under it.
    const size = () => toBinary(OutcomeSchema, wire).length;
    const send = (o: WireOutcome) => this.record(() => this.ledger.complete({ tenant: call.tenant, key: call.key, token: c.token, outcome: o }));
    if (sizeBound(wire) > this.maxOutcomeBytes && size() > this.maxOutcomeBytes) {
      await send(notKept(ErrorCode.OUTCOME_TOO_LARGE, size(), this.maxOutcomeBytes));
      return;
    }
    const err = await send(wire);
    const le = ledgerError(err);
    // A ledger still unreachable after the tries leaves the key in progress;
    // only the ledger's own refusal says the outcome cannot be kept.
    if (err === undefined || (le?.retryable ?? isTransport(err)) || le?.code === ErrorCode.LEASE_LOST) {
      return;
    }
    await send(notKept(le?.code === ErrorCode.OUTCOME_TOO_LARGE ? ErrorCode.OUTCOME_TOO_LARGE : ErrorCode.INTERNAL, size(), this.maxOutcomeBytes));
  }

  // record runs a Complete or Release, retried on retryable answers
  // (persist); it returns the last error, if any.
  private record(call: () => Promise<unknown>): Promise<unknown> {
    return this.persist(call, (err) => {
      const le = ledgerError(err);
      return [le?.retryable ?? isTransport(err), le?.retryAfterMs ?? 0];
    });
  }

  // persist calls call until it succeeds, fails for good (again says
  // whether an error is worth another try, and the least wait before it),
  // or completeWithinMs (from the first try's start) would pass before the
  // next try: tries that fail at once (a ledger that is down) go on, at
  // most 1 s apart, until it is back. It returns the last error, if any.
  private async persist(call: () => Promise<unknown>, again: (err: unknown) => [boolean, number]): Promise<unknown> {
    const until = Date.now() + this.completeWithinMs;
    for (let attempt = 1; ; attempt++) {
      try {
        await call();
        return undefined;
      } catch (err) {
        const [retry, after] = again(err);
        const pause = Math.max(after, Math.random() * Math.min(1000, 20 * 2 ** attempt));
        if (!retry || until - Date.now() < pause) {
          return err;
        }
        await sleep(pause);
      }
    }
  }

  // keepAlive extends the lease every half lease while the run goes on;
  // a lost lease aborts the run.
  private keepAlive(call: Call, c: Claim, ctl: AbortController): () => void {
    const lease = call.policy.leaseMs ?? c.leaseExpiresAtMs - Date.now();
    if (lease <= 0) {
      return () => {};
    }
    const every = setInterval(() => {
      this.ledger.extend({ tenant: call.tenant, key: call.key, token: c.token, lease: call.policy.leaseMs ? durationFromMs(call.policy.leaseMs) : undefined },
        { timeoutMs: Math.max(lease / 2, 1000) }).catch((err) => {
        if (ledgerError(err)?.code === ErrorCode.LEASE_LOST) {
          ctl.abort(new LedgerError(ErrorCode.IN_PROGRESS, "another attempt took over this key", { retryAfterMs: 100 }));
        }
      });
    }, lease / 2);
    return () => clearInterval(every);
  }
}

function begin(call: Call): BeginRequest {
  const p = call.policy;
  return create(BeginRequestSchema, {
    tenant: call.tenant,
    key: call.key,
    fingerprint: call.fingerprint,
    method: call.method,
    keySource: call.keySource ?? "",
    lease: p.leaseMs ? durationFromMs(p.leaseMs) : undefined,
    retention: p.retentionMs ? durationFromMs(p.retentionMs) : undefined,
    onLeaseExpiry: p.onLeaseExpiry === "hold" ? OnLeaseExpiry.HOLD : OnLeaseExpiry.UNSPECIFIED,
    tombstoneRetention: p.noTombstones ? durationFromMs(0) : p.tombstoneRetentionMs ? durationFromMs(p.tombstoneRetentionMs) : undefined,
  });
}

// beginError is what the caller hears when Begin fails: the ledger's typed
// error as it is, except that an unreachable ledger is UNAVAILABLE (fail
// closed) and the service's own credential problems are INTERNAL.
function beginError(err: unknown): LedgerError {
  const le = ledgerError(err);
  if (le === undefined || le.code === ErrorCode.UNAVAILABLE) {
    const cause = le?.metadata.cause;
    const msg = cause === "store" ? "the idempotency ledger is up, but its store is unavailable"
      : cause === "shutdown" ? "the idempotency ledger instance is shutting down"
        : "the idempotency ledger cannot be reached";
    return new LedgerError(ErrorCode.UNAVAILABLE, msg, { retryAfterMs: Math.max(1000, le?.retryAfterMs ?? 0), metadata: cause ? { cause } : {}, cause: err });
  }
  if (le.code === ErrorCode.UNAUTHENTICATED) {
    return new LedgerError(ErrorCode.INTERNAL, "internal error", { cause: err });
  }
  return le;
}

// verdict is what a fence row read by reserve says of the record's
// attempt token: it holds the fence, uncommitted; the record committed it;
// a later attempt or record holds it.
function verdict(row: FenceRow, scope: { createdUs: bigint }, token: bigint): "ours" | "committed" | "taken" {
  if (row.createdUs !== scope.createdUs) {
    return row.createdUs > scope.createdUs ? "taken" : "ours";
  }
  if (row.outcome) {
    return "committed";
  }
  return row.token === token ? "ours" : "taken";
}

function fromFence(b: Uint8Array): Outcome {
  return fromWire(fromBinary(OutcomeSchema, b));
}

function takenOver(): LedgerError {
  return new LedgerError(ErrorCode.IN_PROGRESS, "another attempt took over this key", { retryAfterMs: 100 });
}

function toWire(o: Outcome): WireOutcome {
  if (o.response) {
    return create(OutcomeSchema, { result: { case: "response", value: o.response } });
  }
  return create(OutcomeSchema, { result: { case: "status", value: o.status ?? { code: 13, message: "an empty outcome", details: [] } } });
}

function fromWire(o: WireOutcome | undefined): Outcome {
  switch (o?.result.case) {
    case "response":
      return { response: o.result.value };
    case "status":
      return { status: { code: o.result.value.code, message: o.result.value.message, details: o.result.value.details } };
  }
  throw new LedgerError(ErrorCode.INTERNAL, "the ledger replayed an empty outcome");
}

/** statusError is the typed error a stored status carries. */
export function statusError(status: { code: number; message: string; details: Any[] }): LedgerError {
  for (const d of status.details) {
    const detail = anyUnpack(d, ErrorDetailSchema);
    if (detail) {
      const after = detail.retryAfter;
      return new LedgerError(detail.code, status.message, {
        retryable: detail.retryable, metadata: { ...detail.metadata },
        retryAfterMs: after ? Number(after.seconds) * 1000 + Math.floor(after.nanos / 1e6) : 0,
      });
    }
  }
  return new LedgerError(ErrorCode.INTERNAL, status.message);
}

// notKept is the outcome stored in place of one the ledger cannot keep.
function notKept(code: ErrorCode, size: number, limit: number): WireOutcome {
  const message = code === ErrorCode.OUTCOME_TOO_LARGE
    ? `the call ran, but its answer (${size} bytes) is larger than the idempotency ledger keeps (${limit} bytes), so it cannot be replayed: do not retry this intent`
    : `the call ran, but its answer (${size} bytes) could not be stored, so it cannot be replayed: do not retry this intent`;
  const detail = create(ErrorDetailSchema, { code, retryable: false, metadata: { applied: "true", sizeBytes: String(size), limitBytes: String(limit) } });
  const grpcCode = code === ErrorCode.OUTCOME_TOO_LARGE ? Code.FailedPrecondition : Code.Internal;
  return create(OutcomeSchema, { result: { case: "status", value: {
    code: grpcCode, message, details: [{ $typeName: "google.protobuf.Any", typeUrl: "type.googleapis.com/" + ErrorDetailSchema.typeName, value: toBinary(ErrorDetailSchema, detail) }],
  } } });
}

function isUnknown(err: unknown): boolean {
  for (let e = err; e instanceof Error; e = e.cause) {
    if (e instanceof OutcomeUnknownError) {
      return true;
    }
  }
  return false;
}

function isTransport(err: unknown): boolean {
  const ce = ConnectError.from(err);
  return ce.code === Code.Unavailable || ce.code === Code.DeadlineExceeded;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (ms <= 0 || signal?.aborted) {
      resolve();
      return;
    }
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
  });
}

export { codeName, timestampFromMs };
