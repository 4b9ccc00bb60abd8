// The plugin's pure parts and both entries with stand-ins, run by `bun test` (tests/test_plugin_ts.py
// runs it from pytest with the Bun of the `bun` npm package).
import { afterAll, describe, expect, test } from "bun:test"
import { mkdtempSync, mkdirSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import plugin, {
  CUT,
  HISTORY,
  LocalGuard,
  MAX_CHARS,
  MAX_DEPTH,
  MAX_VALUES,
  MARK,
  MAX_SESSIONS,
  MAX_STEPS,
  OWN_REFUSAL,
  PROTOCOL,
  VERSION,
  VERSION_HEADER,
  blockText,
  canonical,
  endedSession,
  isCut,
  localFeedback,
  makeAsker,
  makeJudge,
  ownPort,
  ownSocket,
  pidLink,
  refusal,
  v1Hooks,
  v2Hooks,
  signature,
  Steps,
  socketFor,
  untrustedSocket,
  versionSkew,
  type V2PermissionEvent,
  type V2ToolEvent,
} from "../../monitor/plugin/loop-guard.ts"

// What every question carries besides the call (issue 46).
const RELEASE = { plugin_version: VERSION, protocol: PROTOCOL }
const A: [string, object] = ["read", { filePath: "a.txt" }]
const B: [string, object] = ["bash", { command: "ls", description: "list" }]
const C: [string, object] = ["grep", { pattern: "x" }]
const D: [string, object] = ["edit", { filePath: "a.txt", oldString: "1", newString: "2" }]

/** The 1-based index of the first call the guard refuses, or null. */
function firstBlocked(calls: [string, object][], guard = new LocalGuard(), session = "ses_1"): number | null {
  for (let i = 0; i < calls.length; i++) {
    if (guard.call(session, calls[i][0], calls[i][1]) !== null) return i + 1
  }
  return null
}

const times = <T>(block: T[], n: number): T[] => Array.from({ length: n }, () => block).flat()

describe("the plugin's own rule", () => {
  test("a single call is blocked on its 4th", () => {
    expect(firstBlocked(times([A], 6))).toBe(4)
    const guard = new LocalGuard()
    for (let i = 0; i < 3; i++) expect(guard.call("ses_1", ...A)).toBeNull()
    expect(guard.call("ses_1", ...A)).toEqual({ tools: ["read"], repetitions: 4 })
  })

  test("A B x3 on the 6th, A B C x3 on the 9th, A B C D x3 on the 12th", () => {
    expect(firstBlocked(times([A, B], 4))).toBe(6)
    expect(firstBlocked(times([A, B, C], 4))).toBe(9)
    expect(firstBlocked(times([A, B, C, D], 4))).toBe(12)
    const guard = new LocalGuard()
    expect(firstBlocked(times([A, B, C, D], 3).slice(0, 11), guard)).toBeNull()
    expect(guard.call("ses_1", ...D)).toEqual({ tools: ["read", "bash", "grep", "edit"], repetitions: 3 })
  })

  test("A B C A B C A B is not a loop", () => {
    expect(firstBlocked([A, B, C, A, B, C, A, B])).toBeNull()
  })

  test("a changed argument is a different call", () => {
    const changed: [string, object] = ["read", { filePath: "b.txt" }]
    expect(firstBlocked([A, A, A, changed, A, A])).toBeNull()
    expect(firstBlocked([A, A, A, ["read", { filePath: "a.txt " }]])).toBeNull() // strings kept exactly
    expect(firstBlocked([A, A, A, ["write", { filePath: "a.txt" }]])).toBeNull() // the tool counts
  })

  test("key order is ignored, recursively; undefined and null fields are absent", () => {
    const calls: [string, object][] = [
      ["edit", { filePath: "a", options: { b: 1, a: [{ y: 2, x: 1 }] } }],
      ["edit", { options: { a: [{ x: 1, y: 2 }], b: 1 }, filePath: "a" }],
      ["edit", { filePath: "a", options: { b: 1, a: [{ x: 1, y: 2 }] }, limit: undefined }],
      ["edit", { filePath: "a", options: { b: 1, a: [{ x: 1, y: 2, z: null }] } }],
    ]
    expect(firstBlocked(calls)).toBe(4)
    expect(canonical({ b: 1, a: { d: [1, "x"], c: null }, e: undefined })).toBe('{"a":{"d":[1,"x"]},"b":1}')
    expect(canonical([undefined, null])).toBe("[null,null]")
    expect(signature("read", { filePath: "é\n" })).toBe('read\u0000{"filePath":"é\\n"}')
  })

  test("deep arguments do not overflow the stack", () => {
    let deep: unknown = "x"
    for (let i = 0; i < 100_000; i++) deep = [deep]
    expect(canonical(deep)).toBe("[".repeat(MAX_DEPTH) + CUT)
    let within: unknown = "x"
    for (let i = 1; i < MAX_DEPTH; i++) within = [within]
    expect(canonical(within)).toBe("[".repeat(MAX_DEPTH - 1) + '"x"' + "]".repeat(MAX_DEPTH - 1))
  })

  test("hostile arguments cost a bounded time, are never sent (the call is told of), and their loop is still caught", async () => {
    // Issue 33: wide or deep arguments took 583-1,644 ms a call in the hook (its bound is
    // WAIT_MS, 200 ms), and were then written out whole for the daemon, which refuses them.
    const wide: Record<string, number> = {}
    for (let i = 0; i < 50_000; i++) wide[`k${(i * 7919) % 50_000}_${i}`] = i
    let deep: unknown = 1
    for (let i = 0; i < 100_000; i++) deep = { a: deep }
    const hostile: [string, unknown][] = [
      ["wide", { x: wide }],
      ["deep", deep],
      ["long", { a: Array.from({ length: 1_000_000 }, (_, i) => i) }],
      ["big", { content: "x".repeat(50 << 20) }],
      ["many", { a: Array.from({ length: 5_000 }, () => ({ b: "y".repeat(1_000) })) }],
    ]
    // The floor, measured in the same run: arguments just within the bound, read whole. On a
    // loaded machine (CI beside other tests) both slow down together; quiet, the hostile
    // ones stay within WAIT_MS, the plugin's bound for a question, 200 ms.
    const judgeFour = async (name: string, args: unknown) => {
      const asked: unknown[] = []
      const { judge } = makeJudge(async (body) => (asked.push(body), { block: null }), "/p", () => {})
      const slowest = { ms: 0 }
      const refused = []
      for (let i = 0; i < 4; i++) {
        const started = performance.now()
        refused.push(await judge("ses_1", `c${i}`, name, args))
        slowest.ms = Math.max(slowest.ms, performance.now() - started)
      }
      return { asked, slowest: slowest.ms, refused }
    }
    const floor = (await judgeFour("floor", { a: Array.from({ length: MAX_VALUES - 2 }, (_, i) => i) })).slowest
    const bound = Math.max(200, 10 * floor)
    for (const [name, args] of hostile) {
      const { asked, slowest, refused } = await judgeFour(name, args)
      expect({ name, cut: isCut(canonical(args)) }).toEqual({ name, cut: true })
      // Its own rule takes a few ms (a wide object costs one enumeration of its keys, which
      // no bound can spare).
      expect({ name, ms: slowest < bound ? "within" : `${slowest} ms, floor ${floor}` }).toEqual({ name, ms: "within" })
      expect(refused.slice(0, 3)).toEqual([null, null, null])
      expect(refused[3]!.startsWith(OWN_REFUSAL)).toBe(true)
      // Told of, never sent: each question carries no arguments at all.
      expect(asked.map((body) => [(body as any).args_cut, "args" in (body as object)])).toEqual(times([[true, false]], 4))
    }
    // Within the bound, arguments are read whole and asked about, as before.
    expect(isCut(canonical({ content: "x".repeat(MAX_CHARS - 20) }))).toBe(false)
    expect(isCut(canonical({ a: Array.from({ length: MAX_VALUES - 2 }, (_, i) => i) }))).toBe(false)
  })

  test("a looping session among 300 busy ones is caught: the least recently active is forgotten", () => {
    // Issue 33: the first session seen was forgotten first, so the looping one, active all
    // along, lost its history as 256 other sessions came and went.
    const guard = new LocalGuard()
    let others = 0
    const found = []
    for (let round = 0; round < 4; round++) {
      found.push(guard.call("ses_loop", ...A))
      for (let i = 0; i < 100; i++) guard.call(`ses_other${others++}`, ...B)
    }
    expect(others).toBe(400)
    expect(found.slice(0, 3)).toEqual([null, null, null])
    expect(found[3]).toEqual({ tools: ["read"], repetitions: 4 })
    expect(guard.size).toBe(MAX_SESSIONS)
  })

  test("two sessions are apart", () => {
    const guard = new LocalGuard()
    for (let i = 0; i < 3; i++) {
      expect(guard.call("ses_1", ...A)).toBeNull()
      expect(guard.call("ses_2", ...A)).toBeNull()
    }
    expect(guard.call("ses_1", ...A)).not.toBeNull()
    expect(guard.call("ses_3", ...A)).toBeNull()
  })

  test("history is bounded: per session and in sessions", () => {
    const guard = new LocalGuard()
    for (let i = 0; i < 100; i++) guard.call("ses_1", "read", { filePath: `f${i}` })
    expect(guard.held("ses_1")).toBe(HISTORY)
    for (let i = 0; i < MAX_SESSIONS + 10; i++) guard.call(`ses_n${i}`, ...A)
    expect(guard.size).toBe(MAX_SESSIONS)
    expect(guard.held("ses_1")).toBe(0) // the oldest went first
    expect(guard.held(`ses_n${MAX_SESSIONS + 9}`)).toBe(1)
  })

  test("cleanup: session.idle and session.deleted forget a session's calls", () => {
    expect(endedSession({ type: "session.idle", properties: { sessionID: "ses_1" } })).toBe("ses_1")
    expect(endedSession({ type: "session.deleted", properties: { info: { id: "ses_2" } } })).toBe("ses_2")
    expect(endedSession({ type: "session.status", properties: { sessionID: "ses_1" } })).toBeNull()
    expect(endedSession(undefined)).toBeNull()
    const guard = new LocalGuard()
    for (let i = 0; i < 3; i++) guard.call("ses_1", ...A)
    guard.forget("ses_1")
    expect(guard.held("ses_1")).toBe(0)
    expect(firstBlocked(times([A], 4), guard)).toBe(4) // a fresh budget of three
  })
})

describe("what the model reads", () => {
  test("the local refusal starts with the mark and names the loop", () => {
    const text = localFeedback({ tools: ["read", "ba\nsh"], repetitions: 3 })
    expect(text.startsWith(OWN_REFUSAL + ": it would have completed a loop")).toBe(true)
    expect(text).toContain("2 calls (read, ba sh) repeated 3 times")
  })

  test("a block without usable feedback gets a fallback text, never a bare Error", () => {
    for (const feedback of ["", "   ", undefined, null, 3, {}]) {
      const text = blockText(feedback, "bash")
      expect(text.startsWith(MARK)).toBe(true)
      expect(text).toContain("(bash) was refused and did not run")
    }
    expect(blockText("the daemon's words", "bash")).toBe("the daemon's words")
  })

  test("the thrown error reads as its message alone", () => {
    expect(String(refusal(MARK + "x"))).toBe(MARK + "x")
  })
})

describe("the judge: the daemon first, the local rule when it does not answer", () => {
  const silent = () => {}
  test("the daemon's verdict wins while it answers", async () => {
    const asked: Record<string, unknown>[] = []
    const { judge } = makeJudge(async (body) => (asked.push(body), { block: null }), "/p", silent)
    for (let i = 0; i < 5; i++) expect(await judge("ses_1", `c${i}`, ...A)).toBeNull()
    expect(asked.map((b) => b.call_id)).toEqual(["c0", "c1", "c2", "c3", "c4"])
    expect(asked[0]).toEqual({ session_id: "ses_1", call_id: "c0", tool: "read", args: A[1], directory: "/p", fell_open: 0, ...RELEASE })
  })

  test("no daemon: the 4th identical call is refused, the log says so once, fell_open counts what ran", async () => {
    const lines: string[] = []
    let up = false
    const asked: Record<string, unknown>[] = []
    const ask = async (body: Record<string, unknown>) => {
      asked.push(body)
      return up ? { block: null } : { fellOpen: "no answer from the monitor at S (x)" }
    }
    const { judge } = makeJudge(ask, "/p", (line) => lines.push(line))
    const results = []
    for (let i = 0; i < 5; i++) results.push(await judge("ses_1", `c${i}`, ...A))
    expect(results.map((r) => r === null)).toEqual([true, true, true, false, false])
    expect(results[3]!.startsWith(MARK)).toBe(true)
    expect(lines).toEqual([
      "opencode-loop-monitor: no answer from the monitor at S (x); the calls of session ses_1 are checked by the plugin's own loop rule while it lasts",
    ])
    up = true
    await judge("ses_1", "c5", ...B)
    expect(asked[5].fell_open).toBe(3) // the three that ran unasked; the refused ones did not run
  })

  test("calls asked about at once report what fell open once between them, never below zero", async () => {
    let up = false
    let slow = true // answers wait until the test gives them, so that 5 are under way at once
    const asked: Record<string, unknown>[] = []
    const answers: (() => void)[] = []
    const ask = async (body: Record<string, unknown>) => {
      asked.push(body)
      if (!up) return { fellOpen: "no answer from the monitor at S (x)" }
      if (slow) await new Promise<void>((resolve) => answers.push(resolve))
      return { block: null }
    }
    const { judge } = makeJudge(ask, "/p", () => {})
    await judge("ses_1", "c0", ...A)
    await judge("ses_1", "c1", ...B) // two ran unasked
    up = true
    const burst = [0, 1, 2, 3, 4].map((i) => judge("ses_1", `p${i}`, "read", { filePath: `f${i}` }))
    for (let i = 0; i < 100 && answers.length < 5; i++) await new Promise((r) => setTimeout(r, 1))
    expect(answers.length).toBe(5)
    for (const answer of answers) answer()
    await Promise.all(burst)
    slow = false
    expect(asked.slice(2).map((body) => body.fell_open)).toEqual([2, 0, 0, 0, 0])
    await judge("ses_1", "c9", ...C)
    expect(asked[7].fell_open).toBe(0) // counted once: nothing negative left behind
  })

  test("50 questions at once across timeouts: the counts answered add up to the calls let through", async () => {
    // Issue 33 (done when): whatever the interleaving, each call let through unasked is
    // reported once, by an answered question, and no count goes below zero.
    let seed = 33
    const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31
    let up = false // the daemon answers about half the questions, late or not at all
    const reported: number[] = []
    let fellOpen = 0
    const ask = async (body: Record<string, unknown>) => {
      const answered = up || random() < 0.5
      await new Promise((resolve) => setTimeout(resolve, Math.floor(random() * 5)))
      if (!answered) return fellOpen++, { fellOpen: "no answer from the monitor at S (TimeoutError)" }
      reported.push(body.fell_open as number)
      return { block: null }
    }
    const { judge } = makeJudge(ask, "/p", () => {})
    const calls = Array.from({ length: 50 }, (_, i) => judge(`ses_${i % 7}`, `c${i}`, "read", { filePath: `f${i}` }))
    expect(await Promise.all(calls)).toEqual(Array(50).fill(null))
    up = true
    await judge("ses_x", "last", "read", { filePath: "last" }) // carries what is left
    expect(fellOpen).toBeGreaterThan(10)
    expect(reported.every((n) => n >= 0)).toBe(true)
    expect(reported.reduce((a, b) => a + b, 0)).toBe(fellOpen)
  })

  test("arguments the rule cannot read are asked about, never refused for it", async () => {
    const lines: string[] = []
    const { judge } = makeJudge(async () => ({ block: null }), "/p", (line) => lines.push(line))
    expect(await judge("ses_1", "c0", "odd", { n: 1n })).toBeNull()
    expect(lines).toEqual([expect.stringContaining("the plugin's own rule failed on a call of odd")])
  })

  test("a call too large to ask about: the daemon is told of it without its arguments, the own rule decides", async () => {
    // Issue 43: the daemon learns the session's plugin asks, so it counts the own rule's
    // refusal as its block instead of aborting the run; its block, if any, wins.
    const asked: Record<string, unknown>[] = []
    let block: string | null = null
    const { judge } = makeJudge(async (body) => (asked.push(body), { block }), "/p", silent)
    const big = { filePath: "big.txt", content: "x".repeat(MAX_CHARS + 1) }
    const results = []
    for (let i = 0; i < 4; i++) results.push(await judge("ses_1", `c${i}`, "write", big))
    expect(results.map((r) => r === null)).toEqual([true, true, true, false])
    expect(results[3]!.startsWith(OWN_REFUSAL)).toBe(true)
    expect(asked[0]).toEqual({ session_id: "ses_1", call_id: "c0", tool: "write", args_cut: true, directory: "/p", fell_open: 0, ...RELEASE })
    // The daemon took each count: the calls that ran are reported once, with the next.
    expect(asked.map((b) => b.fell_open)).toEqual([0, 1, 1, 1])
    block = "refused by the daemon"
    expect(await judge("ses_1", "c9", "write", big)).toBe("refused by the daemon")
  })

  test("a daemon's block is refused with its text", async () => {
    const { judge } = makeJudge(async () => ({ block: "no" }), "/p", silent)
    expect(await judge("ses_1", "c0", ...A)).toBe("no")
  })
})

test("the socket is named after the server's port", () => {
  expect(socketFor("/run/user/1/opencode-loop-monitor", "http://127.0.0.1:4096/")).toBe(
    "/run/user/1/opencode-loop-monitor/plugin-4096.sock",
  )
  expect(socketFor("/d", "http://localhost:43123")).toBe("/d/plugin-43123.sock")
  expect(socketFor("/d", "http://[::1]:5000/base")).toBe("/d/plugin-5000.sock")
  expect(socketFor("/d", "http://localhost")).toBe("/d/plugin-80.sock")
  expect(socketFor("/d", "not a url")).toBeNull()
})

describe("the default export loads in both generations", () => {
  test("1.x: an object with id and server(); 2.x: setup()", () => {
    expect(plugin.id).toBe("opencode-loop-monitor")
    expect(typeof plugin.server).toBe("function")
    expect(typeof plugin.setup).toBe("function")
  })

  test("1.x entry: each question names the step its session is in, as the server's events showed it", async () => {
    const asked: Record<string, unknown>[] = []
    const hooks = v1Hooks(makeJudge(async (body) => (asked.push(body), { block: null }), "/p", () => {}))
    const part = (callID: string, messageID: string, type = "tool") => ({
      event: { type: "message.part.updated", properties: { part: { type, sessionID: "ses_1", callID, messageID } } },
    })
    const step = (id: string, role = "assistant") => ({
      event: { type: "message.updated", properties: { info: { id, role, sessionID: "ses_1" } } },
    })
    const ask = (callID: string, sessionID = "ses_1") =>
      hooks["tool.execute.before"]({ tool: "read", sessionID, callID }, { args: A[1] })
    await ask("c0") // no event yet: no step
    await hooks.event(part("c1", "msg_A"))
    await ask("c1")
    await hooks.event(step("msg_B"))
    await hooks.event(step("msg_U", "user")) // not a step of the model's
    await hooks.event(part("c2", "msg_C", "text")) // not a call
    // Issue 43: call ids repeat at every step; c1 of step B, asked before its part's event,
    // is of step B, not of the step A's c1 was in.
    await ask("c1")
    await ask("c2", "ses_2")
    expect(asked.map((b) => b.message_id)).toEqual([undefined, "msg_A", "msg_B", undefined])
    expect("message_id" in asked[0]).toBe(false)
  })

  test("the steps remembered are bounded, the least recent session forgotten first", () => {
    const steps = new Steps()
    const note = (n: number) =>
      steps.note({ type: "message.part.updated", properties: { part: { type: "tool", sessionID: `ses_${n}`, callID: "c0", messageID: `msg_${n}` } } })
    for (let n = 0; n <= MAX_STEPS; n++) note(n)
    expect(steps.of("ses_0")).toBeUndefined()
    expect(steps.of("ses_1")).toBe("msg_1")
    expect(steps.of(`ses_${MAX_STEPS}`)).toBe(`msg_${MAX_STEPS}`)
  })

  test("1.x entry: throws the refusal with the daemon away, clears on idle", async () => {
    const hooks = v1Hooks(makeJudge(async () => ({ fellOpen: "down" }), "/p", () => {}))
    const call = (n: number) =>
      hooks["tool.execute.before"]({ tool: "read", sessionID: "ses_1", callID: `c${n}` }, { args: A[1] })
    for (let i = 0; i < 3; i++) await call(i)
    const thrown = await call(3).then(() => null, (error: unknown) => error)
    expect(String(thrown).startsWith(MARK + "this call was refused")).toBe(true)
    await hooks.event({ event: { type: "session.idle", properties: { sessionID: "ses_1" } } })
    for (let i = 4; i < 7; i++) await call(i) // a fresh budget of three
    await hooks.event({ event: { type: "session.deleted", properties: { info: { id: "ses_1" } } } })
    for (let i = 7; i < 10; i++) await call(i)
  })
})

describe("the 2.x entry with a stand-in ctx", () => {
  function standIn() {
    const hooks: { before?: (e: V2ToolEvent) => Promise<void>; evaluate?: (e: V2PermissionEvent) => Promise<void> } = {}
    const ctx = {
      location: { directory: "/p" },
      tool: { hook: async (_: "execute.before", cb: (e: V2ToolEvent) => Promise<void>) => void (hooks.before = cb) },
      permission: {
        hook: async (_: "evaluate", cb: (e: V2PermissionEvent) => Promise<void>) => void (hooks.evaluate = cb),
      },
    }
    return { ctx, hooks }
  }

  async function call(hooks: ReturnType<typeof standIn>["hooks"], id: string) {
    await hooks.before!({ tool: "shell", sessionID: "ses_1", id, input: { command: "ls" } })
    const check: V2PermissionEvent = { sessionID: "ses_1", source: { type: "tool", id }, effect: "allow" }
    await hooks.evaluate!(check)
    return check
  }

  test("the call completing a loop is denied at its permission check with the refusal", async () => {
    const { ctx, hooks } = standIn()
    await v2Hooks(ctx, async () => ({ fellOpen: "down" }))
    for (let i = 0; i < 3; i++) expect((await call(hooks, `c${i}`)).effect).toBe("allow")
    const fourth = await call(hooks, "c3")
    expect(fourth.effect).toBe("deny")
    expect(fourth.message!.startsWith(MARK + "this call was refused")).toBe(true)
    // A permission check of another call is left alone.
    const other: V2PermissionEvent = { sessionID: "ses_1", source: { type: "tool", id: "zz" }, effect: "ask" }
    await hooks.evaluate!(other)
    expect(other.effect).toBe("ask")
  })

  test("the daemon's block is denied with its text", async () => {
    const { ctx, hooks } = standIn()
    const bodies: Record<string, unknown>[] = []
    await v2Hooks(ctx, async (body) => (bodies.push(body), { block: "daemon says no" }))
    const check = await call(hooks, "c0")
    expect([check.effect, check.message]).toEqual(["deny", "daemon says no"])
    expect(bodies[0]).toEqual({ session_id: "ses_1", call_id: "c0", tool: "shell", args: { command: "ls" }, directory: "/p", fell_open: 0, ...RELEASE })
  })

  test("each question names the step its hook named", async () => {
    // 2.2.5's execute.before names the call's step: the daemon needs no event to tell a
    // question of a new step from one of the step before.
    const { ctx, hooks } = standIn()
    const bodies: Record<string, unknown>[] = []
    await v2Hooks(ctx, async (body) => (bodies.push(body), { verdict: "allow" } as never))
    for (const [id, messageID] of [["c0", "msg_a"], ["c1", "msg_b"], ["c2", ""]]) {
      await hooks.before!({ tool: "read", sessionID: "ses_1", id, input: { path: "a" }, messageID })
    }
    expect(bodies.map((body) => body.message_id)).toEqual(["msg_a", "msg_b", undefined])
  })
})

describe("asking the daemon (a stand-in on a Unix socket)", () => {
  const dir = mkdtempSync(`${tmpdir()}/olm-`)
  afterAll(() => rmSync(dir, { recursive: true, force: true }))
  const answers: Record<string, () => Response> = {
    allow: () => Response.json({ verdict: "allow" }),
    empty: () => Response.json({ verdict: "block", feedback: "" }),
    words: () => Response.json({ verdict: "block", feedback: "stop that" }),
    maybe: () => Response.json({ verdict: "maybe" }),
    text: () => new Response("not json"),
    failed: () => Response.json({ error: "the monitor failed to judge this call" }, { status: 500 }),
  }
  const seen: { auth: string | null; body: any }[] = []
  const socket = `${dir}/plugin-4096.sock`
  const server = Bun.serve({
    unix: socket,
    async fetch(request) {
      const body = await request.json()
      seen.push({ auth: request.headers.get("Authorization"), body })
      return answers[body.tool]()
    },
  })
  afterAll(() => server.stop(true))
  const endpoint = { url: "http://localhost/v1/decide", socket: null, socketDir: dir, tokenFile: null }
  const ask = makeAsker(endpoint, "http://127.0.0.1:4096/")
  const body = (tool: string) => ({ session_id: "ses_1", call_id: "c", tool, args: {}, directory: "/p", fell_open: 0, ...RELEASE })

  test("the server's own socket is asked; its verdicts are taken", async () => {
    expect(await ask(body("allow"), "allow")).toEqual({ block: null })
    expect(await ask(body("words"), "words")).toEqual({ block: "stop that" })
    expect(seen.at(-1)).toEqual({ auth: null, body: body("words") })
  })

  test("a block without feedback is refused with the fallback text", async () => {
    const verdict = await ask(body("empty"), "bash")
    expect("block" in verdict && verdict.block!.startsWith(MARK)).toBe(true)
  })

  test("a malformed answer falls open (the local rule decides)", async () => {
    expect(await ask(body("maybe"), "maybe")).toEqual({ fellOpen: `the monitor at ${socket} answered no verdict` })
    expect("fellOpen" in (await ask(body("text"), "text"))).toBe(true)
    expect(await ask(body("failed"), "failed")).toEqual({
      fellOpen: `the monitor at ${socket} refused: 500 the monitor failed to judge this call`,
    })
  })

  test("another server's plugin asks another socket, where nothing listens: our words, not Bun's", async () => {
    const verdict = await makeAsker(endpoint, "http://127.0.0.1:5000")(body("allow"), "allow")
    expect(verdict).toEqual({
      fellOpen:
        `no answer from the monitor at ${dir}/plugin-5000.sock (nothing listens there: ` +
        "is `opencode-loop-monitor watch` running for this server?)",
    })
  })

  test("without a server URL (2.x) the socket written at install is asked", async () => {
    const pinned = { ...endpoint, socket }
    expect(await makeAsker(pinned, null)(body("allow"), "allow")).toEqual({ block: null })
  })

  test("over TCP the question is signed: an impostor on the port learns no token and is not believed", async () => {
    // Issue 33: the token went in the clear to whoever listened on the port while the daemon
    // was down, and its "allow" let the 4th identical call run.
    const tcp = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch: (request) => (seen.push({ auth: request.headers.get("Authorization"), body: null }), answers.allow()),
    })
    try {
      writeFileSync(`${dir}/token`, "s3cret\n")
      const url = `http://127.0.0.1:${tcp.port}/v1/decide`
      const ask = makeAsker({ url, socket: null, socketDir: null, tokenFile: `${dir}/token` }, null)
      const verdict = await ask(body("allow"), "allow")
      expect(verdict).toEqual({
        fellOpen: `the answer from ${url} is not proven with the token (not the monitor's?)`,
      })
      const auth = seen.at(-1)!.auth!
      expect(auth).toMatch(/^OLM-HMAC [0-9a-f]{32} [0-9a-f]{64}$/)
      expect(auth).not.toContain("s3cret")
      const lines: string[] = []
      const { judge } = makeJudge(ask, "/p", (line) => lines.push(line))
      const refused = []
      for (let i = 0; i < 4; i++) refused.push(await judge("ses_1", `c${i}`, "read", { filePath: "a" }))
      expect(refused.slice(0, 3)).toEqual([null, null, null])
      expect(refused[3]!.startsWith(OWN_REFUSAL)).toBe(true) // the plugin's own rule, not the impostor's allow
      expect(lines.length).toBe(1)
    } finally {
      tcp.stop(true)
    }
  })

  test("a proof made with the token is believed; one for another question is not", async () => {
    const { createHmac } = await import("node:crypto")
    let replay: string | null = null
    const tcp = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      async fetch(request) {
        const raw = new Uint8Array(await request.arrayBuffer())
        const [, nonce] = request.headers.get("Authorization")!.split(" ")
        const text = JSON.stringify({ verdict: "block", feedback: "from the daemon" })
        const proof = createHmac("sha256", "s3cret").update(`answer ${nonce}\n`).update(text).digest("hex")
        const expected = createHmac("sha256", "s3cret").update(`question ${nonce}\n`).update(raw).digest("hex")
        expect(request.headers.get("Authorization")!.split(" ")[2]).toBe(expected)
        const given = replay ?? proof
        replay = proof // the next answer carries this question's proof: a replayed answer
        return new Response(text, { headers: { "X-Loop-Monitor-Proof": given, "Content-Type": "application/json" } })
      },
    })
    try {
      writeFileSync(`${dir}/token`, "s3cret\n")
      const url = `http://127.0.0.1:${tcp.port}/v1/decide`
      const ask = makeAsker({ url, socket: null, socketDir: null, tokenFile: `${dir}/token` }, null)
      expect(await ask(body("bash"), "bash")).toEqual({ block: "from the daemon" })
      expect("fellOpen" in (await ask(body("bash"), "bash"))).toBe(true)
    } finally {
      tcp.stop(true)
    }
  })
})

describe("a socket another user could have put there is not asked", () => {
  const uid = process.getuid!()
  const root = uid === 0
  test.skipIf(!root)("a socket or a folder of another user, a folder others can write in", async () => {
    const { chownSync, chmodSync, mkdirSync } = await import("node:fs")
    const dir = mkdtempSync(`${tmpdir()}/olm-`)
    const socket = `${dir}/plugin-4096.sock`
    let asked = 0
    const server = Bun.serve({ unix: socket, fetch: () => (asked++, Response.json({ verdict: "allow" })) })
    try {
      const ask = makeAsker({ url: "http://localhost/v1/decide", socket, socketDir: null, tokenFile: null }, null)
      const body = { session_id: "ses_1", call_id: "c", tool: "read", args: {}, directory: "/p", fell_open: 0 }
      expect(await ask(body, "read")).toEqual({ block: null })
      chownSync(socket, 65534, 65534)
      expect(await ask(body, "read")).toEqual({
        fellOpen: `not asked: the socket ${socket} belongs to another user (uid 65534), so it may not be the monitor's`,
      })
      chownSync(socket, 0, 0)
      chmodSync(dir, 0o1777)
      expect(await ask(body, "read")).toEqual({
        fellOpen: `not asked: others can write in the folder ${dir} (mode 777), so it may not be the monitor's`,
      })
      chmodSync(dir, 0o700)
      chownSync(dir, 65534, 65534)
      expect("fellOpen" in (await ask(body, "read"))).toBe(true)
      expect(asked).toBe(1)
    } finally {
      server.stop(true)
      rmSync(dir, { recursive: true, force: true })
    }
  })

  test("the check itself, as any user: our own private folder passes, nothing there is left to fetch", () => {
    const dir = mkdtempSync(`${tmpdir()}/olm-`)
    try {
      expect(untrustedSocket(`${dir}/plugin-1.sock`, uid)).toBeNull()
      expect(untrustedSocket(`${dir}/plugin-1.sock`, uid + 1)).toBe(
        root ? null : `the folder ${dir} belongs to another user (uid ${uid})`,
      )
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe("versions: a plugin and a daemon of different releases say so (issue 46)", () => {
  const where = "/run/olm/plugin-4096.sock"

  test("the daemon's version header against the plugin's own", () => {
    expect(versionSkew(`${VERSION}; protocol=${PROTOCOL}`, where)).toBeNull()
    expect(versionSkew(null, where)).toBe(
      `opencode-loop-monitor: the monitor at ${where} says no version: it is of an earlier release ` +
        `than this plugin (${VERSION}); restart it (\`opencode-loop-monitor watch\`, or its service)`,
    )
    expect(versionSkew(`9.0.0+0123abcd; protocol=${PROTOCOL + 1}`, where)).toBe(
      `opencode-loop-monitor: this plugin is version ${VERSION}, the monitor at ${where} 9.0.0+0123abcd: ` +
        "run `opencode-loop-monitor plugin install` and restart OpenCode",
    )
    expect(versionSkew("0.0.1+0123abcd; protocol=1", where)).toBe(
      `opencode-loop-monitor: this plugin is version ${VERSION}, the monitor at ${where} 0.0.1+0123abcd: ` +
        "restart the monitor with the release that installed this plugin",
    )
  })

  test("said in the server's log once, and again only when the daemon's version changes", async () => {
    const dir = mkdtempSync(`${tmpdir()}/olm-`)
    const socket = `${dir}/plugin-4096.sock`
    // An older daemon first (no version; it refuses fields it does not know, as releases
    // before ee7c001 did), then this release's, then the older one again.
    const versions: (string | null)[] = [null, null, `${VERSION}; protocol=${PROTOCOL}`, null]
    const server = Bun.serve({
      unix: socket,
      fetch() {
        const version = versions.shift() ?? null
        if (version === null) return Response.json({ error: "unknown field(s): plugin_version, protocol" }, { status: 400 })
        return Response.json({ verdict: "allow" }, { headers: { [VERSION_HEADER]: version } })
      },
    })
    try {
      const lines: string[] = []
      const ask = makeAsker({ url: "http://localhost/v1/decide", socket, socketDir: null, tokenFile: null }, null, (line) =>
        lines.push(line),
      )
      const body = { session_id: "ses_1", call_id: "c", tool: "read", args: {}, directory: "/p", fell_open: 0, ...RELEASE }
      const verdicts = []
      for (let i = 0; i < 4; i++) verdicts.push(await ask(body, "read"))
      expect(verdicts).toEqual([
        { fellOpen: `the monitor at ${socket} refused: 400 unknown field(s): plugin_version, protocol` },
        { fellOpen: `the monitor at ${socket} refused: 400 unknown field(s): plugin_version, protocol` },
        { block: null },
        { fellOpen: `the monitor at ${socket} refused: 400 unknown field(s): plugin_version, protocol` },
      ])
      expect(lines).toEqual([versionSkew(null, socket), versionSkew(null, socket)])
    } finally {
      server.stop(true)
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe("a 2.x plugin finds its own server's daemon (OpenCode 2 gives it no URL)", () => {
  // What 2.2.5 showed a plugin of its process (V2-REAL-NOTES section 6): the server's own pid,
  // and its command line; the background service has no port on it, but a registration.
  const BUN = ["bun", "/$bunfs/root/opencode"]
  const served = (port: string, pid = 4405) => ({ pid, argv: [...BUN, "serve", "--hostname", "127.0.0.1", "--port", port], env: {} })
  const service = (pid: number, env: Record<string, string> = { XDG_STATE_HOME: "/s" }) => ({ pid, argv: [...BUN, "serve", "--service"], env })
  const registration = (pid: number, url = "http://127.0.0.1:49374") =>
    JSON.stringify({ id: "6b532e01", version: "2.2.5", url, pid, password: "x" })
  const none = () => null
  const silent = () => {}

  test("`serve --port N` and `--port=N`: the port on its command line", () => {
    expect(ownPort(served("4596"), none)).toBe(4596)
    expect(ownPort({ pid: 1, argv: [...BUN, "serve", "--hostname=127.0.0.1", "--port=4598"], env: {} }, none)).toBe(4598)
  })

  test("no port, or none a daemon could be named after: unknown", () => {
    expect(ownPort(served("0"), none)).toBeNull() // a port the system picks: only the pid says
    expect(ownPort(served("70000"), none)).toBeNull()
    expect(ownPort(served("4596x"), none)).toBeNull()
    expect(ownPort({ pid: 1, argv: [...BUN, "serve", "--port"], env: {} }, none)).toBeNull()
    // A plain `serve` (4096) reads no registration: the service's is of another process.
    const never = () => {
      throw new Error("read")
    }
    expect(ownPort({ pid: 1, argv: [...BUN, "serve"], env: { XDG_STATE_HOME: "/s" } }, never)).toBeNull()
    // Past `--` it is someone else's argument.
    expect(ownPort({ pid: 1, argv: [...BUN, "serve", "--", "--port", "1"], env: {} }, none)).toBeNull()
  })

  test("the background service: OpenCode's registration, when it names this process", () => {
    const read = (text: string) => (path: string) => (path === "/s/opencode/service.json" ? text : null)
    expect(ownPort(service(4691), read(registration(4691)))).toBe(49374)
    expect(ownPort(service(4691), read(registration(4691, "http://127.0.0.1:5123")))).toBe(5123)
    // Another service's registration, or a stale one: another server.
    expect(ownPort(service(4692), read(registration(4691)))).toBeNull()
    expect(ownPort(service(4691), read("{not json"))).toBeNull()
    expect(ownPort(service(4691), read(JSON.stringify({ pid: 4691 })))).toBeNull()
    // Without XDG_STATE_HOME, OpenCode's default under HOME.
    const home = (path: string) => (path === "/h/.local/state/opencode/service.json" ? registration(7) : null)
    expect(ownPort(service(7, { HOME: "/h" }), home)).toBe(49374)
    expect(ownPort(service(7, {}), home)).toBeNull()
  })

  describe("the socket asked, looked up at each question", () => {
    const dir = mkdtempSync(`${tmpdir()}/olm-`)
    afterAll(() => rmSync(dir, { recursive: true, force: true }))

    test("the port's socket; the link a daemon named after this pid first, when it leads somewhere", () => {
      const find = ownSocket(dir, served("4596", 321), none)
      expect(find()).toBe(`${dir}/plugin-4596.sock`)
      // A daemon given a mapped port (or --port 0) learned this pid from /api/info.
      writeFileSync(`${dir}/plugin-14596.sock`, "")
      symlinkSync("plugin-14596.sock", pidLink(dir, 321))
      expect(find()).toBe(`${dir}/plugin-14596.sock`)
      // Its socket gone (the daemon stopped): the port's socket again.
      unlinkSync(`${dir}/plugin-14596.sock`)
      expect(find()).toBe(`${dir}/plugin-4596.sock`)
      unlinkSync(pidLink(dir, 321))
    })

    test("a service registered after its plugins loaded is found at the next question", () => {
      let text: string | null = null
      const find = ownSocket(dir, service(4691), () => text)
      expect(find()).toBeNull() // then the socket written at install
      text = registration(4691)
      expect(find()).toBe(`${dir}/plugin-49374.sock`)
    })
  })

  test("the daemon of the service's port is asked, not the one install named; a 1.x URL wins", async () => {
    // V2-REAL-NOTES 7.4: the 2.x entry asked plugin-4096.sock, found no daemon on any other
    // port, refused a loop's call by its own rule while the real daemon interrupted the run.
    const dir = mkdtempSync(`${tmpdir()}/olm-`)
    const heard: string[] = []
    const listen = (name: string) =>
      Bun.serve({ unix: `${dir}/${name}`, fetch: () => (heard.push(name), Response.json({ verdict: "allow" })) })
    const servers = [listen("plugin-49374.sock"), listen("plugin-4096.sock"), listen("plugin-5000.sock")]
    try {
      mkdirSync(`${dir}/state/opencode`, { recursive: true })
      writeFileSync(`${dir}/state/opencode/service.json`, registration(4691))
      const endpoint = { url: "http://localhost/v1/decide", socket: `${dir}/plugin-4096.sock`, socketDir: dir, tokenFile: null }
      const own = ownSocket(dir, service(4691, { XDG_STATE_HOME: `${dir}/state` }))
      const body = { session_id: "ses_1", call_id: "c", tool: "read", args: {}, directory: "/p", fell_open: 0, ...RELEASE }
      expect(await makeAsker(endpoint, null, silent, own)(body, "read")).toEqual({ block: null })
      expect(await makeAsker(endpoint, "http://127.0.0.1:5000", silent, own)(body, "read")).toEqual({ block: null })
      // Nothing found: the socket written at install, as before.
      expect(await makeAsker(endpoint, null, silent, () => null)(body, "read")).toEqual({ block: null })
      expect(heard).toEqual(["plugin-49374.sock", "plugin-5000.sock", "plugin-4096.sock"])
      // A fixed socket (no folder) is asked whatever the process says.
      const fixed = { ...endpoint, socketDir: null }
      expect(await makeAsker(fixed, null, silent, own)(body, "read")).toEqual({ block: null })
      expect(heard.at(-1)).toBe("plugin-4096.sock")
    } finally {
      for (const server of servers) server.stop(true)
      rmSync(dir, { recursive: true, force: true })
    }
  })

  test("an unanswered question names the socket the lookup chose", async () => {
    const dir = mkdtempSync(`${tmpdir()}/olm-`)
    try {
      const endpoint = { url: "http://localhost/v1/decide", socket: `${dir}/plugin-4096.sock`, socketDir: dir, tokenFile: null }
      const body = { session_id: "ses_1", call_id: "c", tool: "read", args: {}, directory: "/p", fell_open: 0, ...RELEASE }
      const verdict = await makeAsker(endpoint, null, silent, ownSocket(dir, served("4596"), none))(body, "read")
      expect(verdict).toEqual({
        fellOpen:
          `no answer from the monitor at ${dir}/plugin-4596.sock (nothing listens there: ` +
          "is `opencode-loop-monitor watch` running for this server?)",
      })
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
