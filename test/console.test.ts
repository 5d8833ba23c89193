// The web console (services/gateway/console) in a real headless Chromium (Debian's), driven by
// puppeteer-core: sign in, start a turn with a tool call and watch it stream, steer a running
// turn, abort one, reload and find the session again. With CONSOLE_SCREENSHOTS=<dir>, a
// screenshot of each state is written there (docs/console/ holds the ones docs/console.md shows).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync } from "node:fs";
import path from "node:path";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import { startStack, writeAgent, type Stack } from "./helpers/stack.js";

// The page's globals, as the functions run in the browser use them (the project's lib has no DOM).
declare const document: {
  querySelector(selector: string): { textContent: string | null } | null;
  querySelectorAll(selector: string): { length: number };
};

const CHROMIUM = ["/usr/bin/chromium", "/usr/bin/chromium-browser"].find((p) => existsSync(p));
const SHOTS = process.env.CONSOLE_SCREENSHOTS;

let stack: Stack;
let browser: Browser;
let page: Page;

before(async () => {
  assert.ok(CHROMIUM, "Debian's chromium is not installed (make test installs it)");
  stack = await startStack({ env: { TROUPE_SANDBOX_POOL: "0", TROUPE_MEMORY_LEARN: "0" } });
  // The console's sessions are the default agent's: its schedules wait for a person (approvals.md).
  await writeAgent(stack.dataDir, "main", { approvals: { tools: { manage_schedule: "ask" } } });
  browser = await puppeteer.launch({
    executablePath: CHROMIUM,
    headless: true,
    // Root in CI: Chromium's own sandbox needs user namespaces it may not have.
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
  });
  page = await browser.newPage();
  await page.setViewport({ width: 1200, height: 800 });
  if (SHOTS) mkdirSync(SHOTS, { recursive: true });
});

after(async () => {
  await browser?.close();
  await stack?.stop();
});

const shot = async (name: string) => {
  if (SHOTS) await page.screenshot({ path: path.join(SHOTS, `${name}.png`) });
};
const text = (selector: string) => page.$eval(selector, (e) => e.textContent ?? "");
const waitText = (selector: string, pattern: RegExp, timeout = 20_000) =>
  page.waitForFunction(
    (sel: string, source: string) => new RegExp(source).test(document.querySelector(sel)?.textContent ?? ""),
    { timeout },
    selector,
    pattern.source,
  );
const send = async (message: string, button: "prompt" | "steer" | "followUp" = "prompt") => {
  await page.type("#text", message);
  await page.click(`button[data-kind="${button}"]`);
};

describe("the web console in Chromium", () => {
  test("a wrong key is refused, the right one signs in", async () => {
    const errors: string[] = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(`http://${stack.addr.http}/`);
    await page.type("#api-key", "not-a-key");
    await page.click("#sign-in button[type=submit]");
    await waitText("#sign-in-error", /unauthenticated/);
    assert.equal(await page.$("#app").then((e) => e!.isVisible()), false);
    await shot("1-sign-in-refused");
    await page.$eval("#api-key", (e) => ((e as unknown as { value: string }).value = ""));
    await page.type("#api-key", stack.apiKey);
    await page.click("#sign-in button[type=submit]");
    await page.waitForSelector("#app", { visible: true });
    assert.equal(await page.$("#sign-in").then((e) => e!.isVisible()), false);
    assert.match(await text("#who"), new RegExp(`…${stack.apiKey.slice(-4)}$`));
    assert.deepEqual(errors, []);
    // A user key: no operator's views.
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(await page.$("#admin-nav").then((e) => e!.isVisible()), false);
    // Only in this tab's session storage.
    assert.equal(await page.evaluate(() => localStorage.length), 0);
    assert.equal(await page.evaluate(() => sessionStorage.getItem("troupe.key")), stack.apiKey);
  });

  test("a turn with a tool call streams: the command, its output, the reply", async () => {
    await page.click("#new-session");
    await page.waitForSelector("#session", { visible: true });
    await send("$ echo from-the-console-sandbox");
    await waitText(
      "#events",
      /⚙ exec[\s\S]*from-the-console-sandbox[\s\S]*Tool results: [\s\S]*from-the-console-sandbox/,
    );
    await waitText("#events", /run ended: completed/);
    await shot("2-tool-call");
    const sessions = await text("#sessions");
    assert.match(sessions, /main/);
  });

  test("a call held for approval shows its buttons; Reject asks why, Approve runs it", async () => {
    page.once("dialog", (d) => void d.accept("not today"));
    await send('!call manage_schedule {"action": "list"}');
    await page.waitForSelector('.tool.held button[data-verdict="TOOL_VERDICT_REJECT"]', { timeout: 20_000 });
    await waitText("#events", /the run waits for a decision/);
    await shot("3-approval");
    await page.click('.tool.held button[data-verdict="TOOL_VERDICT_REJECT"]');
    await waitText("#events", /rejected by dev: not today[\s\S]*run ended: completed/);
    assert.equal(await page.$$eval(".tool.held .decide", (n) => n.length), 0, "a decided call has no buttons");
    await send('!call manage_schedule {"action": "list"}');
    await page.waitForSelector('.tool.held .decide button[data-verdict="TOOL_VERDICT_APPROVE"]', { timeout: 20_000 });
    await page.click('.tool.held .decide button[data-verdict="TOOL_VERDICT_APPROVE"]');
    await waitText("#events", /approved by dev[\s\S]*\(no schedules\)[\s\S]*run ended: completed/);
  });

  test("steering a running turn, then aborting one", async () => {
    await send("!tokens 300 rate=30");
    await page.waitForFunction(
      () => (document.querySelector(".msg.assistant:last-of-type")?.textContent ?? "").length > 10,
    );
    await send("also mention the weather", "steer");
    await waitText("#events", /steer accepted/);
    await waitText("#events", /steer applied/, 30_000);
    await shot("3-steered");
    await send("!tokens 300 rate=30");
    await page.waitForFunction(() => document.querySelectorAll(".msg.user").length >= 4);
    await new Promise((r) => setTimeout(r, 800));
    await page.click("#abort");
    await waitText("#events", /run ended: aborted/);
    await shot("4-aborted");
  });

  test("a reload keeps the key and the session, and the stream goes on from the log", async () => {
    const before = await text("#events");
    const seq = await page.$eval("#events", (e) => Number((e as unknown as { dataset: { seq: string } }).dataset.seq));
    await page.reload();
    await page.waitForSelector("#session", { visible: true });
    await waitText("#events", /run ended: aborted/);
    assert.equal(
      await page.$eval("#events", (e) => Number((e as unknown as { dataset: { seq: string } }).dataset.seq)),
      seq,
    );
    for (const part of ["$ echo from-the-console-sandbox", "also mention the weather"])
      assert.ok((await text("#events")).includes(part), part);
    assert.equal(
      (await text("#events")).includes("from-the-console-sandbox"),
      before.includes("from-the-console-sandbox"),
    );
    // And it is live: a new turn appears.
    await send("!tokens 3");
    await waitText("#events", /t1 t2 t3/);
    await shot("5-after-reload");
  });

  test("an admin key sees the sandboxes and the audit log", async () => {
    const adminKey = await stack.keyFor("ops", "root", { role: "admin" });
    await page.click("#sign-out");
    await page.waitForSelector("#sign-in", { visible: true });
    await page.type("#api-key", adminKey);
    await page.click("#sign-in button[type=submit]");
    await page.waitForSelector("#admin-nav", { visible: true });
    await page.click("#show-sandboxes");
    // The development tenant's session sandbox, made by the tool call above.
    await waitText("#admin-rows", /session:local\.dev\.[\s\S]*running/);
    await shot("6-sandboxes");
    await page.click("#show-audit");
    await waitText("#admin-rows", /abort[\s\S]*local[\s\S]*from the console/);
    assert.match(await text("#admin-status"), /rows?, read/);
    await shot("7-audit-log");
  });
});
