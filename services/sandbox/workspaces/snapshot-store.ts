// Where snapshots are kept (TROUPE_SANDBOX_SNAPSHOTS): a directory, or a bucket on S3 or
// S3-compatible storage. A store holds, under a name `<folder>/<id>` (parts already injective,
// snapshots.ts), one archive and one JSON record; the record is written last and removed first,
// so a snapshot is listed only once its archive is whole. The stores are in snapshot-stores.ts.
import type { Logger } from "../../shared/process/log.js";

export interface SnapshotStore {
  /** Where, for logs and errors: a path, or s3://bucket/prefix. */
  readonly where: string;
  /** A local file to write `name`'s archive into before putArchive; removed by putArchive. */
  staging(name: string): Promise<string>;
  /** Keeps the archive written to `staged` as `name`'s, whole or not at all. */
  putArchive(name: string, staged: string, bytes: number): Promise<void>;
  /** A local file holding `name`'s archive, to read and not to change; undefined when it has none. */
  archive(name: string): Promise<string | undefined>;
  /** Writes `name`'s record, whole or not at all. */
  putRecord(name: string, value: unknown): Promise<void>;
  /** `name`'s record; undefined when it has none (or it cannot be read as JSON). */
  readRecord<T>(name: string): Promise<T | undefined>;
  /** The names that have a record, in `folder` or, without one, in every folder. */
  names(folder?: string): Promise<string[]>;
  /** Removes `name`'s record, then its archive. */
  remove(name: string): Promise<void>;
  /**
   * Removes what a write cut short left behind (a staged archive, an archive whose record was
   * never written), once it is over STALE_MS old; the number removed. Run once, before counting.
   */
  sweep?(): Promise<number>;
}

/** How old a leftover must be before a sweep takes it: no write in flight is that slow. */
export const STALE_MS = 3_600_000;

/** What every store is made with: the service's data directory (the default store, caches) and its logger. */
export interface StoreContext {
  dataDir: string;
  logger: Logger;
}
