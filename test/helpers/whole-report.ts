// Preloaded into every test file's process by `make test` and `make test-unit` (--import). Under
// `node --test` a file reports its verdicts to the runner through a pipe, and Node writes to pipes
// without blocking; --test-force-exit then exits with verdicts still unwritten, and the runner
// counts fewer tests than ran, with exit 0 (nodejs/node#64833). Here that cost 2 of 309 unit
// verdicts in one CI run, and 4 to 7 % of a synthetic suite's. Blocking writes to the runner's
// pipe leave nothing unwritten at exit. A file run on its own, outside the runner, is untouched.
type PipeHandle = { setBlocking?: (blocking: boolean) => void };

if (process.env.NODE_TEST_CONTEXT?.startsWith("child")) {
  (process.stdout as unknown as { _handle?: PipeHandle })._handle?.setBlocking?.(true);
}
