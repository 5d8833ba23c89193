// Preloaded by `make test` and `make test-unit` (--require, so that it runs in the runner itself as
// well as in every test file's process; --import reaches only the files). Under --test-force-exit
// each of them ends in process.exit(), which must neither lose what it wrote nor hang.
//
// Nothing lost. Node writes to pipes without blocking, and a forced exit drops what is unwritten:
// - a file's verdicts to the runner (nodejs/node#64833): the runner counts fewer tests than ran,
//   with exit 0. Here that cost 2 of 309 unit verdicts in one CI run, and 4 to 7 % of a synthetic
//   suite's;
// - the runner's own report when its reader is slower than it (CI's log, under load): a CI run
//   lost the summary lines of 1,000 verdicts, and a reader taking 4 KB every 2 ms loses them
//   every time.
// Blocking writes leave nothing unwritten at exit. Output to a file or a terminal is untouched.
//
// No hang. A forced exit can wait forever on a background compile (services/shared/process/exit.ts):
// CI's last minutes went to a test file whose tests had all passed. The runner passes no V8 flag
// on to the files it starts, so each process turns those compiles off here, before its own code.
import { keepHeapCompilesOnMainThread } from "../../services/shared/process/exit.js";

type PipeHandle = { setBlocking?: (blocking: boolean) => void };

const inTestFile = process.env.NODE_TEST_CONTEXT?.startsWith("child");
const isRunner = process.execArgv.includes("--test");
if (inTestFile || isRunner) {
  (process.stdout as unknown as { _handle?: PipeHandle })._handle?.setBlocking?.(true);
  keepHeapCompilesOnMainThread();
}
