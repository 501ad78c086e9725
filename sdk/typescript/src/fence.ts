// The fence: a guarded run whose write lands in the service's own
// PostgreSQL or CockroachDB writes its key's fence in the same
// transaction, a row of (namespace, tenant, key) holding the record's
// creation, the claim's token, the method and the answer, and the guard
// completes the key with that answer. The statements are those of the Go
// module interceptors/fence, on the same table (migrations/, as the Go
// module ships them). See docs/fence.md.
import { AsyncLocalStorage } from "node:async_hooks";
import { ErrorCode } from "./gen/idemledger/v1/errors_pb.js";
import { LedgerError } from "./errors.js";

/** What the fence needs of node-postgres: a pg.Pool, a pg.Client or a checked-out PoolClient. */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[]; rowCount: number | null }>;
}

/** The record a fence belongs to. */
export interface FenceScope {
  namespace: string;
  tenant: string;
  key: string;
  method: string;
  /** The record's creation, in microseconds since the Unix epoch: takeovers keep it, a new record of the key has a later one. */
  createdUs: bigint;
  /** The end of the record's retention, or of the claim's lease where that is later. */
  expiresAt: Date;
}

/** A key's fence as FenceTable.reserve reads it. */
export interface FenceRow {
  createdUs: bigint;
  token: bigint;
  /** The committed outcome (an idemledger.v1.Outcome's encoding); undefined while no transaction committed it. */
  outcome?: Uint8Array;
}

const reserveSQL = `INSERT INTO idemledger_fences AS f (namespace, tenant, idem_key, record_created_us, token, method, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (namespace, tenant, idem_key) DO UPDATE SET
	record_created_us = excluded.record_created_us, token = excluded.token, method = excluded.method,
	outcome = NULL, expires_at = GREATEST(f.expires_at, excluded.expires_at)
WHERE f.record_created_us < excluded.record_created_us
   OR (f.record_created_us = excluded.record_created_us AND f.outcome IS NULL AND f.token < excluded.token)
RETURNING record_created_us, token, outcome`;

const readSQL = `SELECT record_created_us, token, outcome FROM idemledger_fences
WHERE namespace = $1 AND tenant = $2 AND idem_key = $3`;

const writeSQL = `INSERT INTO idemledger_fences AS f (namespace, tenant, idem_key, record_created_us, token, method, outcome, expires_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (namespace, tenant, idem_key) DO UPDATE SET
	record_created_us = excluded.record_created_us, token = excluded.token, method = excluded.method,
	outcome = excluded.outcome, expires_at = GREATEST(f.expires_at, excluded.expires_at)
WHERE f.record_created_us < excluded.record_created_us
   OR (f.record_created_us = excluded.record_created_us AND f.token = excluded.token AND f.outcome IS NULL)`;

const sweepSQL = `DELETE FROM idemledger_fences WHERE (namespace, tenant, idem_key) IN (
	SELECT namespace, tenant, idem_key FROM idemledger_fences WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)`;

/** The fence table of a node-postgres database, for a policy's fence. It must hold the table (the migrations the package ships). */
export class FenceTable {
  constructor(readonly db: Queryable) {}

  /**
   * reserve makes token the one attempt of the record that may commit
   * the key's fence, unless an attempt already committed it or a later
   * one holds it, and returns the fence as it stands after. The guard
   * calls it, outside the run's transaction.
   */
  async reserve(s: FenceScope, token: bigint): Promise<FenceRow> {
    return retried(async () => {
      let res = await this.db.query(reserveSQL, [s.namespace, s.tenant, s.key, s.createdUs.toString(), token.toString(), s.method, s.expiresAt]);
      if (res.rows.length === 0) {
        res = await this.db.query(readSQL, [s.namespace, s.tenant, s.key]);
      }
      const r = res.rows[0];
      if (!r) {
        throw new Error("fence: the key's fence is gone");
      }
      const outcome = r.outcome as Uint8Array | null;
      return { createdUs: BigInt(r.record_created_us as string), token: BigInt(r.token as string), outcome: outcome ?? undefined };
    });
  }

  /** sweep deletes up to batch fences that expired before now, the oldest first, and returns how many. */
  async sweep(now: Date, batch: number): Promise<number> {
    return retried(async () => (await this.db.query(sweepSQL, [now, batch])).rowCount ?? 0);
  }
}

/** A fenced run's part in its fence, which the guard hands the run through the async context. */
export class FencedRun {
  attempted = false;
  written?: Uint8Array;

  constructor(readonly scope: FenceScope, readonly token: bigint, readonly encode: (result: unknown) => Uint8Array, readonly expiresAt: () => Date) {}
}

const current = new AsyncLocalStorage<FencedRun>();

/** withFence runs fn with run as its fenced run (the guard's). */
export function withFence<T>(run: FencedRun, fn: () => Promise<T>): Promise<T> {
  return current.run(run, fn);
}

/**
 * writeFence writes the fence of the guarded run it is called from in
 * client, inside the transaction of the run's write (after BEGIN and the
 * write, before COMMIT), with result: what the handler answers (a tool
 * result, an HTTP response { status, headers, body }, an Outcome under
 * Guard.do). Call it once in each try of the transaction. Outside a
 * fenced run it does nothing.
 *
 * It throws a LedgerError, and the transaction must not commit:
 * LEASE_LOST when another attempt holds the fence or committed it (it has
 * rolled the transaction back), UNAVAILABLE (retryable) when the
 * statement failed (the database has aborted the transaction), INTERNAL
 * when result cannot be encoded (it has rolled the transaction back).
 */
export async function writeFence(client: Queryable, result: unknown): Promise<void> {
  const run = current.getStore();
  if (!run) {
    return;
  }
  let outcome: Uint8Array;
  try {
    outcome = run.encode(result);
  } catch (err) {
    await client.query("ROLLBACK").catch(() => {});
    throw err instanceof LedgerError ? err : new LedgerError(ErrorCode.INTERNAL, "the fence's outcome cannot be encoded, so the write does not commit", { cause: err });
  }
  const s = run.scope;
  let rows: number;
  try {
    rows = (await client.query(writeSQL, [s.namespace, s.tenant, s.key, s.createdUs.toString(), run.token.toString(), s.method, Buffer.from(outcome), run.expiresAt()])).rowCount ?? 0;
  } catch (err) {
    throw new LedgerError(ErrorCode.UNAVAILABLE, "the fence could not be written, so the write does not commit: retry with the same key", { retryAfterMs: 100, cause: err });
  }
  if (rows !== 1) {
    run.attempted = true;
    run.written = undefined;
    await client.query("ROLLBACK").catch(() => {});
    throw new LedgerError(ErrorCode.LEASE_LOST, "another attempt of this call holds its fence or committed it: this attempt's transaction was rolled back, its write not applied",
      { metadata: { token: run.token.toString() } });
  }
  run.attempted = true;
  run.written = outcome;
}

// retried runs a statement of its own transaction again on a
// serialization failure or a deadlock, ten times at most.
async function retried<T>(statement: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await statement();
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      if ((code !== "40001" && code !== "40P01") || attempt >= 10) {
        throw err;
      }
      await new Promise((r) => setTimeout(r, Math.random() * Math.min(200, 5 * 2 ** attempt)));
    }
  }
}
