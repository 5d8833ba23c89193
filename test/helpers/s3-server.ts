// The other side of Troupe's S3 snapshot store: an S3 endpoint, path-style, one bucket in memory,
// written from Amazon's published references, not from what our client sends:
// - Signature Version 4 (docs.aws.amazon.com/AmazonS3/latest/API/sig-v4-header-based-auth.html and
//   sigv4-create-canonical-request.html): the canonical request rebuilt from the request as
//   received, every x-amz-* header signed, the scope's date and region, 15 minutes of clock skew,
//   x-amz-content-sha256 required and checked against the body.
// - The operations (API Reference: PutObject, GetObject, HeadObject, DeleteObject, ListObjectsV2,
//   HeadBucket) and their errors (ErrorResponses.html: the <Error> document, its codes and statuses),
//   with x-amz-checksum-sha256 checked on upload (BadDigest) and returned under checksum mode.
// test/unit/s3-server.test.ts holds it to AWS's own signing example and to the official
// @aws-sdk/client-s3, so a client that gets something wrong meets the error S3 would give.
import { createHash, createHmac, randomUUID, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export interface S3ServerOptions {
  bucket: string;
  accessKeyId: string;
  secretAccessKey: string;
  region?: string;
  /** The most keys one ListObjectsV2 page holds (S3's is 1,000; fewer exercises continuation). */
  pageKeys?: number;
}

interface StoredObject {
  body: Buffer;
  contentType: string;
  etag: string;
  sha256?: string;
  modified: Date;
}

const SKEW_MS = 15 * 60_000;

const sha256Hex = (data: string | Buffer) => createHash("sha256").update(data).digest("hex");
const hmac = (key: string | Buffer, data: string) => createHmac("sha256", key).update(data).digest();

/** RFC 3986 encoding as SigV4 defines it: every byte but A-Z a-z 0-9 - . _ ~ (and "/" in a path). */
export function uriEncode(value: string, keepSlash: boolean): string {
  let out = "";
  for (const byte of Buffer.from(value, "utf8")) {
    const c = String.fromCharCode(byte);
    out +=
      /[A-Za-z0-9\-._~]/.test(c) || (keepSlash && c === "/")
        ? c
        : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

/** The SigV4 signature of a request, as S3 computes it on its side. */
export function signatureV4(r: {
  method: string;
  path: string;
  query: [string, string][];
  headers: Record<string, string>;
  signedHeaders: string[];
  payloadHash: string;
  amzDate: string;
  region: string;
  service: string;
  secretAccessKey: string;
}): string {
  const query = r.query
    .map(([k, v]) => [uriEncode(k, false), uriEncode(v, false)])
    .sort(([a, x], [b, y]) => (a < b ? -1 : a > b ? 1 : x < y ? -1 : x > y ? 1 : 0))
    .map(([k, v]) => `${k}=${v}`)
    .join("&");
  const headers = r.signedHeaders.map((h) => `${h}:${(r.headers[h] ?? "").trim().replace(/\s+/g, " ")}\n`).join("");
  const canonical = [r.method, uriEncode(r.path, true), query, headers, r.signedHeaders.join(";"), r.payloadHash].join(
    "\n",
  );
  const day = r.amzDate.slice(0, 8);
  const scope = `${day}/${r.region}/${r.service}/aws4_request`;
  const toSign = ["AWS4-HMAC-SHA256", r.amzDate, scope, sha256Hex(canonical)].join("\n");
  const key = hmac(hmac(hmac(hmac(`AWS4${r.secretAccessKey}`, day), r.region), r.service), "aws4_request");
  return createHmac("sha256", key).update(toSign).digest("hex");
}

class S3Error extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const xmlEscape = (s: string) =>
  s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

/** "20130524T000000Z" as a time; NaN when it is not one. */
function amzTime(value: string): number {
  const m = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/.exec(value);
  return m ? Date.UTC(+m[1], +m[2] - 1, +m[3], +m[4], +m[5], +m[6]) : Number.NaN;
}

export class S3Server {
  readonly objects = new Map<string, StoredObject>();
  /** Each request served, as "METHOD key-or-?query STATUS", for tests to read. */
  readonly log: string[] = [];
  private server?: Server;
  private port = 0;

  constructor(private readonly opts: S3ServerOptions) {}

  get endpoint(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** Listens (again, on the same port after stop). */
  async start(): Promise<void> {
    const server = createServer((req, res) => void this.serve(req, res));
    await new Promise<void>((resolve) => server.listen(this.port, "127.0.0.1", resolve));
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
  }

  async stop(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const requestId = randomUUID();
    res.setHeader("x-amz-request-id", requestId);
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const body = Buffer.concat(chunks);
    const url = new URL(req.url ?? "/", "http://s3.local");
    let key = "";
    try {
      const path = decodeURIComponent(url.pathname);
      const [, bucket = "", ...rest] = path.split("/");
      key = rest.join("/");
      this.authenticate(req, url, path, body);
      if (bucket !== this.opts.bucket) throw new S3Error(404, "NoSuchBucket", "The specified bucket does not exist");
      const status = key === "" ? this.bucketCall(req, url, res) : this.objectCall(req, key, body, res);
      this.log.push(`${req.method} ${key || url.search} ${status}`);
    } catch (err) {
      const e = err instanceof S3Error ? err : new S3Error(500, "InternalError", String(err));
      this.log.push(`${req.method} ${key || url.search} ${e.status} ${e.code}`);
      res.statusCode = e.status;
      if (req.method === "HEAD") {
        res.end();
        return;
      }
      res.setHeader("content-type", "application/xml");
      res.end(
        `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${e.code}</Code><Message>${xmlEscape(e.message)}</Message>` +
          `${key ? `<Key>${xmlEscape(key)}</Key>` : ""}<RequestId>${requestId}</RequestId></Error>`,
      );
    }
  }

  /** Checks the request's SigV4 Authorization header; throws the error S3 answers with. */
  private authenticate(req: IncomingMessage, url: URL, path: string, body: Buffer): void {
    const auth = req.headers.authorization;
    if (!auth) throw new S3Error(403, "AccessDenied", "Access Denied");
    const m =
      /^AWS4-HMAC-SHA256 Credential=([^/,]+)\/(\d{8})\/([^/,]+)\/s3\/aws4_request,\s*SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$/.exec(
        auth,
      );
    if (!m) throw new S3Error(400, "AuthorizationHeaderMalformed", "The authorization header is malformed");
    const [, accessKey, day, region, signed, signature] = m;
    if (accessKey !== this.opts.accessKeyId)
      throw new S3Error(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.");
    if (region !== (this.opts.region ?? "us-east-1"))
      throw new S3Error(400, "AuthorizationHeaderMalformed", `the region '${region}' is wrong`);
    const amzDate = String(req.headers["x-amz-date"] ?? "");
    const at = amzTime(amzDate);
    if (Number.isNaN(at))
      throw new S3Error(403, "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header");
    if (Math.abs(Date.now() - at) > SKEW_MS)
      throw new S3Error(
        403,
        "RequestTimeTooSkewed",
        "The difference between the request time and the current time is too large.",
      );
    if (amzDate.slice(0, 8) !== day)
      throw new S3Error(400, "AuthorizationHeaderMalformed", "the credential's date is not the request's");
    const signedHeaders = signed.split(";");
    const unsigned = Object.keys(req.headers).filter(
      (h) => (h.startsWith("x-amz-") || h === "host") && !signedHeaders.includes(h),
    );
    if (unsigned.length > 0)
      throw new S3Error(
        403,
        "AccessDenied",
        `There were headers present in the request which were not signed: ${unsigned.join(", ")}`,
      );
    const payloadHash = req.headers["x-amz-content-sha256"];
    if (typeof payloadHash !== "string")
      throw new S3Error(400, "InvalidRequest", "Missing required header for this request: x-amz-content-sha256");
    if (payloadHash.startsWith("STREAMING-"))
      throw new S3Error(501, "NotImplemented", "this endpoint takes whole payloads, not aws-chunked ones");
    if (payloadHash !== "UNSIGNED-PAYLOAD" && payloadHash !== sha256Hex(body))
      throw new S3Error(
        400,
        "XAmzContentSHA256Mismatch",
        "The provided 'x-amz-content-sha256' header does not match what was computed.",
      );
    const headers: Record<string, string> = {};
    for (const h of signedHeaders) {
      const v = req.headers[h];
      headers[h] = Array.isArray(v) ? v.join(",") : (v ?? "");
    }
    const query: [string, string][] = [];
    for (const part of url.search.slice(1).split("&").filter(Boolean)) {
      const eq = part.indexOf("=");
      const [k, v] = eq < 0 ? [part, ""] : [part.slice(0, eq), part.slice(eq + 1)];
      query.push([decodeURIComponent(k), decodeURIComponent(v)]);
    }
    const expected = signatureV4({
      method: req.method ?? "GET",
      path,
      query,
      headers,
      signedHeaders,
      payloadHash,
      amzDate,
      region,
      service: "s3",
      secretAccessKey: this.opts.secretAccessKey,
    });
    if (!timingSafeEqual(Buffer.from(expected), Buffer.from(signature)))
      throw new S3Error(
        403,
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided.",
      );
  }

  private bucketCall(req: IncomingMessage, url: URL, res: ServerResponse): number {
    if (req.method === "HEAD") {
      res.end();
      return 200;
    }
    if (req.method !== "GET" || url.searchParams.get("list-type") !== "2")
      throw new S3Error(501, "NotImplemented", "only HeadBucket and ListObjectsV2 are served on a bucket");
    const prefix = url.searchParams.get("prefix") ?? "";
    const maxKeys = Math.min(Number(url.searchParams.get("max-keys") ?? 1000), this.opts.pageKeys ?? 1000);
    const token = url.searchParams.get("continuation-token");
    const after = token ? Buffer.from(token, "base64").toString("utf8") : (url.searchParams.get("start-after") ?? "");
    const keys = [...this.objects.keys()]
      .filter((k) => k.startsWith(prefix) && k > after)
      .sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
    const page = keys.slice(0, maxKeys);
    const truncated = keys.length > page.length;
    const contents = page
      .map((k) => {
        const o = this.objects.get(k)!;
        return `<Contents><Key>${xmlEscape(k)}</Key><LastModified>${o.modified.toISOString()}</LastModified><ETag>${xmlEscape(o.etag)}</ETag><Size>${o.body.length}</Size><StorageClass>STANDARD</StorageClass></Contents>`;
      })
      .join("");
    res.setHeader("content-type", "application/xml");
    res.end(
      `<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">` +
        `<Name>${xmlEscape(this.opts.bucket)}</Name><Prefix>${xmlEscape(prefix)}</Prefix><KeyCount>${page.length}</KeyCount>` +
        `<MaxKeys>${maxKeys}</MaxKeys><IsTruncated>${truncated}</IsTruncated>${contents}` +
        (token ? `<ContinuationToken>${xmlEscape(token)}</ContinuationToken>` : "") +
        (truncated
          ? `<NextContinuationToken>${Buffer.from(page.at(-1)!).toString("base64")}</NextContinuationToken>`
          : "") +
        "</ListBucketResult>",
    );
    return 200;
  }

  private objectCall(req: IncomingMessage, key: string, body: Buffer, res: ServerResponse): number {
    switch (req.method) {
      case "PUT": {
        const length = Number(req.headers["content-length"]);
        if (!Number.isInteger(length))
          throw new S3Error(411, "MissingContentLength", "You must provide the Content-Length HTTP header.");
        const claimed = req.headers["x-amz-checksum-sha256"];
        const sha256 = createHash("sha256").update(body).digest("base64");
        if (typeof claimed === "string" && claimed !== sha256)
          throw new S3Error(400, "BadDigest", "The SHA256 you specified did not match the calculated checksum.");
        const etag = `"${createHash("md5").update(body).digest("hex")}"`;
        this.objects.set(key, {
          body,
          contentType: String(req.headers["content-type"] ?? "binary/octet-stream"),
          etag,
          sha256: typeof claimed === "string" ? sha256 : undefined,
          modified: new Date(),
        });
        res.setHeader("etag", etag);
        if (claimed) res.setHeader("x-amz-checksum-sha256", sha256);
        res.end();
        return 200;
      }
      case "GET":
      case "HEAD": {
        const o = this.objects.get(key);
        if (!o) throw new S3Error(404, "NoSuchKey", "The specified key does not exist.");
        res.setHeader("content-type", o.contentType);
        res.setHeader("content-length", o.body.length);
        res.setHeader("etag", o.etag);
        res.setHeader("last-modified", o.modified.toUTCString());
        if (req.headers["x-amz-checksum-mode"] === "ENABLED" && o.sha256) {
          res.setHeader("x-amz-checksum-sha256", o.sha256);
          res.setHeader("x-amz-checksum-type", "FULL_OBJECT");
        }
        res.end(req.method === "GET" ? o.body : undefined);
        return 200;
      }
      case "DELETE":
        this.objects.delete(key);
        res.statusCode = 204;
        res.end();
        return 204;
      default:
        throw new S3Error(405, "MethodNotAllowed", "The specified method is not allowed against this resource.");
    }
  }
}
