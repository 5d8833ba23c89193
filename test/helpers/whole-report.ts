// Preloaded by `make test` and `make test-unit` (--require, so that it runs in the runner itself as
// well as in every test file's process; --import reaches only the files). Node writes to pipes
// without blocking, and --test-force-exit exits with what is still unwritten:
// - a file's verdicts to the runner (nodejs/node#64833): the runner counts fewer tests than ran,
//   with exit 0. Here that cost 2 of 309 unit verdicts in one CI run, and 4 to 7 % of a synthetic
//   suite's;
// - the runner's own report when its reader is slower than it (CI's log, under load): a CI run
//   lost the summary lines of 1,000 verdicts, and a reader taking 4 KB every 2 ms loses them
//   every time.
// Blocking writes leave nothing unwritten at exit. Output to a file or a terminal is untouched.
type PipeHandle = { setBlocking?: (blocking: boolean) => void };

const inTestFile = process.env.NODE_TEST_CONTEXT?.startsWith("child");
const isRunner = process.execArgv.includes("--test");
if (inTestFile || isRunner) {
  (process.stdout as unknown as { _handle?: PipeHandle })._handle?.setBlocking?.(true);
}
