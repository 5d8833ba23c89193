/** Prints rows under a header as columns two spaces apart, each as wide as its widest cell. */
export function printTable(head: string[], rows: string[][]): void {
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  for (const r of [head, ...rows])
    process.stdout.write(
      `${r
        .map((c, i) => c.padEnd(widths[i]))
        .join("  ")
        .trimEnd()}\n`,
    );
}
