// The 2.x entry under faults (issue 56): `setup`'s hooks with a stand-in ctx, asking a stand-in
// daemon found as on the real 2.2.5 (the link a daemon names after the server's pid, else the
// socket of the server's port), with that daemon hung, slow, gone, or an impostor on its
// channel. Each call falls open within WAIT_MS (at once when nothing listens) and the
// plugin's own rule refuses the loop's 4th call, as on 1.x; an impostor is never asked.
import { afterEach, describe, expect, test } from "bun:test"
import { chmodSync, chownSync, mkdtempSync, rmSync, symlinkSync } from "node:fs"
import { tmpdir } from "node:os"
import {
  OWN_REFUSAL,
  PROTOCOL,
  VERSION,
  WAIT_MS,
  makeAsker,
  ownSocket,
  pidLink,
  v2Hooks,
  type V2PermissionEvent,
  type V2ToolEvent,
} from "../../monitor/plugin/loop-guard.ts"

// How much later than its bound a call may end on a busy machine: the bound is WAIT_MS.
const SLACK_MS = 1500
// The server's process as 2.2.5 shows it to its plugins (V2-REAL-NOTES section 6).
const PID = 4405
const OWN = { pid: PID, argv: ["bun", "/$bunfs/root/opencode", "serve", "--port", "4596"], env: {} }
const BODY = { session_id: "ses_1", call_id: "c", tool: "read", args: {}, directory: "/p", fell_open: 0, plugin_version: VERSION, protocol: PROTOCOL }

type Hooks = { before?: (e: V2ToolEvent) => Promise<void>; evaluate?: (e: V2PermissionEvent) => Promise<void> }

const cleanups: (() => void)[] = []
afterEach(() => {
  for (const cleanup of cleanups.splice(0).reverse()) cleanup()
})

/** A private folder of sockets, removed after the test. */
function folder(): string {
  const dir = mkdtempSync(`${tmpdir()}/olm-`)
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }))
  return dir
}

/** A daemon on `socket`: every question answered by `answer` (which may never settle). */
function daemon(socket: string, answer: () => Promise<Response>) {
  const asked: number[] = []
  const server = Bun.serve({ unix: socket, fetch: () => (asked.push(performance.now()), answer()) })
  cleanups.push(() => server.stop(true))
  return { asked, server }
}

/** The 2.x entry as `setup` makes it, with `plugin install`'s folder `dir`. */
async function entry(dir: string): Promise<Hooks> {
  const hooks: Hooks = {}
  const ctx = {
    location: { directory: "/p" },
    tool: { hook: async (_: "execute.before", cb: (e: V2ToolEvent) => Promise<void>) => void (hooks.before = cb) },
    permission: { hook: async (_: "evaluate", cb: (e: V2PermissionEvent) => Promise<void>) => void (hooks.evaluate = cb) },
  }
  const endpoint = { url: "http://localhost/v1/decide", socket: `${dir}/plugin-4096.sock`, socketDir: dir, tokenFile: null }
  await v2Hooks(ctx, makeAsker(endpoint, null, () => {}, ownSocket(dir, OWN, () => null)))
  return hooks
}

/** Four identical reads, as 2.2.5 runs a call: `execute.before`, then its permission check.
 * What each check became, and how long each call waited. */
async function loop(hooks: Hooks): Promise<{ checks: V2PermissionEvent[]; ms: number[] }> {
  const checks: V2PermissionEvent[] = []
  const ms: number[] = []
  for (let n = 1; n <= 4; n++) {
    const started = performance.now()
    await hooks.before!({ tool: "read", sessionID: "ses_1", id: `call_${n}`, input: { path: "README.md" } })
    const check: V2PermissionEvent = { sessionID: "ses_1", source: { type: "tool", id: `call_${n}` }, effect: "allow" }
    await hooks.evaluate!(check)
    ms.push(performance.now() - started)
    checks.push(check)
  }
  return { checks, ms }
}

/** Calls 1-3 ran; the 4th was refused by the plugin's own rule, not by whoever answered. */
function refusedByItsOwnRule(checks: V2PermissionEvent[]) {
  expect(checks.slice(0, 3).map((check) => check.effect)).toEqual(["allow", "allow", "allow"])
  expect(checks[3].effect).toBe("deny")
  expect(checks[3].message!.startsWith(OWN_REFUSAL)).toBe(true)
}

const never = () => new Promise<Response>(() => {})
const after = (ms: number, response: () => Response) =>
  () => new Promise<Response>((resolve) => setTimeout(() => resolve(response()), ms))
const block = () => Response.json({ verdict: "block", feedback: "the daemon says stop" })

describe("the daemon the server's pid names", () => {
  test("hung: every call waits WAIT_MS at most, the own rule refuses the 4th", async () => {
    const dir = folder()
    const { asked } = daemon(`${dir}/plugin-14596.sock`, never)
    symlinkSync("plugin-14596.sock", pidLink(dir, PID))
    const { checks, ms } = await loop(await entry(dir))
    refusedByItsOwnRule(checks)
    expect(asked.length).toBe(4) // it was asked each time, and waited for no longer than allowed
    for (const wait of ms) expect(wait).toBeLessThan(WAIT_MS + SLACK_MS)
    expect(Math.min(...ms.slice(0, 3))).toBeGreaterThanOrEqual(WAIT_MS - 5)
  })

  test("slow within the bound: its verdict is taken", async () => {
    const dir = folder()
    daemon(`${dir}/plugin-14596.sock`, after(WAIT_MS / 4, block))
    symlinkSync("plugin-14596.sock", pidLink(dir, PID))
    const { checks } = await loop(await entry(dir))
    expect(checks.map((check) => [check.effect, check.message])).toEqual(
      Array.from({ length: 4 }, () => ["deny", "the daemon says stop"]),
    )
  })

  test("slow past the bound: its late block is not waited for, the own rule refuses the 4th", async () => {
    const dir = folder()
    daemon(`${dir}/plugin-14596.sock`, after(WAIT_MS * 3, block))
    symlinkSync("plugin-14596.sock", pidLink(dir, PID))
    const { checks, ms } = await loop(await entry(dir))
    refusedByItsOwnRule(checks)
    for (const wait of ms) expect(wait).toBeLessThan(WAIT_MS * 3)
  })

  test("gone: its socket stopped, nothing listens, every call goes on at once", async () => {
    const dir = folder()
    const { server } = daemon(`${dir}/plugin-14596.sock`, block)
    symlinkSync("plugin-14596.sock", pidLink(dir, PID))
    server.stop(true)
    const { checks, ms } = await loop(await entry(dir))
    refusedByItsOwnRule(checks)
    for (const wait of ms) expect(wait).toBeLessThan(WAIT_MS)
  })
})

describe("an impostor on the channel is never asked", () => {
  test("a link named after the server's pid leading outside the folder", async () => {
    const dir = folder()
    const elsewhere = folder()
    const { asked } = daemon(`${elsewhere}/plugin-14596.sock`, block)
    symlinkSync(`${elsewhere}/plugin-14596.sock`, pidLink(dir, PID))
    const endpoint = { url: "http://localhost/v1/decide", socket: null, socketDir: dir, tokenFile: null }
    expect(await makeAsker(endpoint, null, () => {}, ownSocket(dir, OWN, () => null))(BODY, "read")).toEqual({
      fellOpen: `not asked: the socket ${elsewhere}/plugin-14596.sock is outside the folder ${dir}, so it may not be the monitor's`,
    })
    refusedByItsOwnRule((await loop(await entry(dir))).checks)
    expect(asked).toEqual([])
  })

  const root = process.getuid!() === 0
  test.skipIf(!root)("a socket another user owns, behind the pid's link or on the port", async () => {
    const dir = folder()
    const linked = daemon(`${dir}/plugin-14596.sock`, block)
    symlinkSync("plugin-14596.sock", pidLink(dir, PID))
    chownSync(`${dir}/plugin-14596.sock`, 65534, 65534)
    refusedByItsOwnRule((await loop(await entry(dir))).checks)
    rmSync(pidLink(dir, PID))
    const port = daemon(`${dir}/plugin-4596.sock`, block)
    chownSync(`${dir}/plugin-4596.sock`, 65534, 65534)
    refusedByItsOwnRule((await loop(await entry(dir))).checks)
    expect([linked.asked, port.asked]).toEqual([[], []])
  })

  test.skipIf(!root)("the folder others can write in", async () => {
    const dir = folder()
    const { asked } = daemon(`${dir}/plugin-14596.sock`, block)
    symlinkSync("plugin-14596.sock", pidLink(dir, PID))
    chmodSync(dir, 0o1777)
    refusedByItsOwnRule((await loop(await entry(dir))).checks)
    expect(asked).toEqual([])
  })
})
