// Rows to Arrow columns for LanceDB's add(), built from typed arrays.
//
// Handed plain objects, LanceDB's Node client infers and builds Arrow column by column through
// generic builders, one value at a time: a batch of 1,000 memories with 256-dimension vectors
// took about 70 ms of the writer's time, most of a bulk load's cost. Here each vector is copied
// once into one Float32Array under a FixedSizeList, numbers, times and flags go into typed arrays,
// and a column's strings are encoded in one go. The schema decides every column's type, so a row
// missing a column fails here, before anything is written.
import {
  Bool,
  type Data,
  type DataType,
  FixedSizeList,
  Float32,
  Float64,
  Int32,
  RecordBatch,
  Struct,
  Table,
  Timestamp,
  Utf8,
  makeData,
  type Schema,
} from "apache-arrow";

type Cell = unknown;

function column(type: DataType, name: string, rows: readonly Record<string, Cell>[]): Data {
  const n = rows.length;
  const values = rows.map((r) => {
    const v = r[name];
    if (v === undefined || v === null) throw new Error(`column ${name} is missing in a row`);
    return v;
  });
  if (type instanceof FixedSizeList) {
    const size = type.listSize;
    const flat = new Float32Array(n * size);
    values.forEach((v, i) => {
      // Float32Array or number[] from callers; an Arrow vector when copied from another table.
      const vec =
        Array.isArray(v) || ArrayBuffer.isView(v) ? (v as ArrayLike<number>) : Float32Array.from(v as Iterable<number>);
      if (vec.length !== size) throw new Error(`column ${name} holds ${vec.length} values in a row, not ${size}`);
      flat.set(vec, i * size);
    });
    return makeData({
      type,
      length: n,
      nullCount: 0,
      child: makeData({ type: new Float32(), length: n * size, nullCount: 0, data: flat }),
    });
  }
  if (type instanceof Float64)
    return makeData({ type, length: n, nullCount: 0, data: Float64Array.from(values as number[]) });
  if (type instanceof Int32)
    return makeData({ type, length: n, nullCount: 0, data: Int32Array.from(values as number[]) });
  if (type instanceof Timestamp)
    return makeData({
      type,
      length: n,
      nullCount: 0,
      data: BigInt64Array.from(values as number[], (t) => BigInt(Math.trunc(Number(t)))),
    });
  if (type instanceof Utf8) {
    // One encode of all the strings joined; each string's byte length gives its offsets.
    const strings = values.map(String);
    const valueOffsets = new Int32Array(n + 1);
    strings.forEach((s, i) => {
      valueOffsets[i + 1] = valueOffsets[i] + Buffer.byteLength(s);
    });
    return makeData({ type, length: n, nullCount: 0, valueOffsets, data: Buffer.from(strings.join("")) });
  }
  if (type instanceof Bool) {
    const bits = new Uint8Array(Math.ceil(n / 8));
    values.forEach((v, i) => {
      if (v === true) bits[i >> 3] |= 1 << (i & 7);
      else if (v !== false) throw new Error(`column ${name} holds ${typeof v} in a row, not a boolean`);
    });
    return makeData({ type, length: n, nullCount: 0, data: bits });
  }
  throw new Error(`column ${name}: no conversion for Arrow type ${String(type)}`);
}

/** One record batch of these rows in this schema's columns and types. */
export function arrowTable(schema: Schema, rows: readonly object[]): Table {
  const records = rows as readonly Record<string, Cell>[];
  const children = schema.fields.map((f) => column(f.type as DataType, f.name, records));
  const data = makeData({ type: new Struct(schema.fields), length: rows.length, nullCount: 0, children });
  return new Table(schema, [new RecordBatch(schema, data)]);
}
