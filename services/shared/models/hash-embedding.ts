// A deterministic local embedder: word unigrams and character trigrams hashed into a fixed number
// of dimensions, L2-normalised. Texts that share words and spellings land close together, which is
// enough for memory to work offline and for tests to be exact. Real deployments configure a model.
import { createHash } from "node:crypto";

export const HASH_EMBEDDING_MODEL = "troupe-hash-v1";
export const HASH_EMBEDDING_DIM = 256;

function bucket(feature: string, dim: number): [number, number] {
  const h = createHash("md5").update(feature).digest();
  return [h.readUInt32LE(0) % dim, h[4] & 1 ? 1 : -1];
}

export function hashEmbedding(text: string, dim: number = HASH_EMBEDDING_DIM): Float32Array {
  const v = new Float32Array(dim);
  const words =
    text
      .toLowerCase()
      .normalize("NFKC")
      .match(/[\p{L}\p{N}]+/gu) ?? [];
  for (const w of words) {
    const [i, s] = bucket(`w:${w}`, dim);
    v[i] += 2 * s;
    const padded = `^${w}$`;
    for (let j = 0; j + 3 <= padded.length; j++) {
      const [k, t] = bucket(`c:${padded.slice(j, j + 3)}`, dim);
      v[k] += t;
    }
  }
  let norm = 0;
  for (const x of v) norm += x * x;
  norm = Math.sqrt(norm);
  if (norm > 0) for (let i = 0; i < dim; i++) v[i] /= norm;
  return v;
}
