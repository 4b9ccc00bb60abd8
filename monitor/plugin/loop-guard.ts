/**
 * opencode-loop-monitor's OpenCode plugin: before every tool call it asks the monitor's
 * daemon whether the call completes a loop, and blocks the call when the daemon says so.
 * A blocked call never runs: its part ends in `error` with the feedback, the model reads
 * that as the call's result, and its run goes on.
 *
 * When the daemon does not answer (not running, slow, answering nonsense), the plugin is
 * still a guard: it applies the daemon's first rule itself (`LocalGuard`: one call repeated
 * 4 times, or a block of 2 to 4 calls repeated 3 full times, blocks the call completing it),
 * on what it saw of each session since its last idle (a bounded part of each call's
 * arguments, `canonical`; the least recently active session forgotten first). Any other
 * call runs after at most WAIT_MS (at once when nothing listens), and the server's log says
 * so once per session.
 * The calls let through that way are reported with the next answered request.
 *
 * Where it asks: the daemon watching this server listens on a socket named after the
 * server's port (`socketFor`), so the plugin finds it from the URL OpenCode 1.x gives it at
 * load, whatever the port. OpenCode 2 gives no URL, but the plugin runs in the server's own
 * process: it asks the socket a daemon named after that process's pid (which the server's
 * `/api/info` told the daemon), else the one of the port its command line or OpenCode's
 * service registration says (`ownSocket`). `plugin install` writes the socket folder (or a
 * fixed socket, or a TCP address and token file) into ENDPOINT below. It trusts only its daemon: a socket is
 * asked only when it and its folder are its own user's (`untrustedSocket`), and one found by the
 * pid's link only inside that folder (`outsideFolder`); over TCP each
 * question is signed with the token, which never leaves the process, and an answer counts
 * only with its proof (`signQuestion`): anything else is no answer, and the own rule decides.
 *
 * One file for both OpenCode generations: the default export is an object with `id`,
 * `server` (the 1.x entry: OpenCode >= 1.18.29 loads a default export with `server()` and
 * ignores the other exports) and `setup` (the 2.x entry, what `Plugin.define` returns: it
 * is the identity). The named exports are the pure parts, for `bun test`. No package
 * needed: Bun runs it as it is.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto"
import { readFileSync, realpathSync, statSync } from "node:fs"
import { dirname } from "node:path"

// Where the daemon listens; written by `opencode-loop-monitor plugin install`. With
// `socketDir`, the socket of this server's daemon is in it (`socketFor`, `ownSocket`);
// `socket` is asked when neither finds it, or always when there is no `socketDir`; with
// neither, `url` over loopback TCP with the token in `tokenFile`.
export type Endpoint = { url: string; socket: string | null; socketDir: string | null; tokenFile: string | null }
const ENDPOINT: Endpoint = {"url": "http://localhost/v1/decide", "socket": null, "socketDir": null, "tokenFile": null}
// The release that wrote this file: `plugin install` writes it here (as ENDPOINT), "dev" in
// the package itself. Sent with every question with PROTOCOL, and compared with the version
// the daemon answers with, so that a plugin and a daemon of different releases say so.
export const VERSION = "dev"
// What this plugin knows of the daemon's questions and answers (plugin_protocol.py PROTOCOL).
export const PROTOCOL = 2
export const VERSION_HEADER = "X-Loop-Monitor-Version"
// The longest a call waits for the daemon before the plugin's own rule decides.
export const WAIT_MS = 200
// Sessions already warned about, bounded: a server can run for weeks.
const MAX_WARNED = 1000

/** How every message of the guard starts (monitor/core/feedback.py MARK). */
export const MARK = "Automatic notice: "

// The monitor's `cycle` rule as it first shipped (monitor/core/rules/cycle.py, with
// max_period 4): the plain loops, without the daemon's settings, which it cannot read here.
export const MAX_PERIOD = 4
export const REPEATS = 3
// Period 1: three identical calls in a row are allowed, the fourth is a loop.
export const MIN_CALLS = 4
// Signatures kept a session, all of them read by the rule: the daemon's default history.
export const HISTORY = 32
// Sessions remembered at once; the least recently active is forgotten first (a session
// normally goes idle, and one that loops is calling).
export const MAX_SESSIONS = 256
const TOOL_NAME_MAX = 64

// How much of a call's arguments the plugin reads, so that its own rule takes a bounded time
// whatever a model (or a hostile tool) sends: wide or deep arguments took 0.6-2.7 s a call
// here, in the hook every call waits on. Past MAX_VALUES values, MAX_DEPTH levels or
// MAX_CHARS characters the rest is not read: the text ends with CUT, and such a call is not
// asked about (the daemon refuses a question over its MAX_BODY, 1 MiB, and reads one nested
// deeper than json.loads does a hundred times slower), its own rule judges it on the part read.
export const MAX_VALUES = 10_000
export const MAX_DEPTH = 256
export const MAX_CHARS = 1 << 20
export const CUT = "\u0000\u2026"

/**
 * The call's arguments as the daemon compares them: compact JSON with object keys sorted
 * recursively, strings kept exactly, a field that is undefined or null absent (how an
 * omitted optional argument arrives). An explicit stack: arguments can nest deeply. Bounded
 * (MAX_VALUES, MAX_DEPTH, MAX_CHARS): what lies past the bound is CUT.
 */
export function canonical(value: unknown): string {
  const out: string[] = []
  const stack: unknown[] = [value]
  const TOKEN = Symbol("token")
  type Token = { [TOKEN]: string }
  const token = (text: string): Token => ({ [TOKEN]: text })
  let values = 0
  let depth = 0
  let chars = 0
  while (stack.length) {
    const item = stack.pop()
    if (item !== null && typeof item === "object" && TOKEN in item) {
      const text = (item as Token)[TOKEN]
      if (text === "]" || text === "}") depth--
      out.push(text)
      chars += text.length
      continue
    }
    const room = MAX_VALUES - values++
    if (room <= 0 || chars >= MAX_CHARS) {
      out.push(CUT)
      break
    }
    if (item !== null && typeof item === "object") {
      if (++depth > MAX_DEPTH) {
        out.push(CUT)
        break
      }
    }
    if (Array.isArray(item)) {
      stack.push(token("]"))
      // Only as many elements as could still be read: the rest would be cut anyway.
      if (item.length > room) stack.push(token(CUT))
      for (let i = Math.min(item.length, room) - 1; i >= 0; i--) {
        stack.push(item[i] === undefined ? null : item[i])
        if (i) stack.push(token(","))
      }
      stack.push(token("["))
    } else if (item !== null && typeof item === "object") {
      let keys = Object.keys(item)
      const cut = keys.length > room
      if (cut) keys = keys.slice(0, room)
      keys = keys.filter((k) => (item as Record<string, unknown>)[k] != null).sort()
      stack.push(token("}"))
      if (cut) stack.push(token(CUT))
      for (let i = keys.length - 1; i >= 0; i--) {
        stack.push((item as Record<string, unknown>)[keys[i]])
        stack.push(token(JSON.stringify(keys[i]) + ":"))
        if (i) stack.push(token(","))
      }
      stack.push(token("{"))
    } else if (typeof item === "string" && item.length > MAX_CHARS - chars) {
      out.push(JSON.stringify(item.slice(0, MAX_CHARS - chars)), CUT)
      break
    } else {
      const text = JSON.stringify(item) ?? "null"
      out.push(text)
      chars += text.length
    }
  }
  return out.join("")
}

/** Whether `text` (a canonical text or a signature) was cut at the bound. */
export function isCut(text: string): boolean {
  return text.includes(CUT)
}

/** The call's signature: the exact tool name, a NUL, the canonical arguments. */
export function signature(tool: string, args: unknown): string {
  return `${tool}\u0000${canonical(args ?? {})}`
}

export type Cycle = { tools: string[]; repetitions: number }
type Entry = { key: bigint | number; tool: string }

/**
 * The shortest cycle ending `history` (oldest first), or null: for a period L, the last
 * max(L * REPEATS, MIN_CALLS) entries each equal the one L places before them, looking at
 * no more than HISTORY entries (monitor/core/rules/cycle.py detect_cycle).
 */
export function detectCycle<T>(history: readonly T[]): { length: number; repetitions: number } | null {
  const size = history.length
  const window = Math.min(size, HISTORY)
  if (!size) return null
  const last = history[size - 1]
  for (let length = 1; length <= MAX_PERIOD; length++) {
    const needed = Math.max(length * REPEATS, MIN_CALLS)
    if (needed > window) break
    if (history[size - 1 - length] !== last) continue
    let run = length
    while (run < window && history[size - 1 - run] === history[size - 1 - run + length]) run++
    run = Math.min(run, window)
    if (run >= needed) return { length, repetitions: Math.floor(run / length) }
  }
  return null
}

/**
 * What the plugin knows of each session's calls since it last went idle: at most HISTORY
 * signature digests a session, MAX_SESSIONS sessions. No I/O: it runs inside the hook.
 */
export class LocalGuard {
  private sessions = new Map<string, Entry[]>()

  /** Record a call about to run; the cycle it completes, if any. */
  call(sessionID: string, tool: string, args: unknown): Cycle | null {
    return this.record(sessionID, tool, signature(tool, args))
  }

  /** `call`, with the call's signature made already. */
  record(sessionID: string, tool: string, signed: string): Cycle | null {
    let history = this.sessions.get(sessionID)
    if (history === undefined) {
      if (this.sessions.size >= MAX_SESSIONS) {
        // The least recently active goes (a Map keeps the order of insertion, and every
        // call moves its session to the end): a busy server's looping session is the one
        // calling, not the one to forget.
        this.sessions.delete(this.sessions.keys().next().value as string)
      }
      history = []
    } else {
      this.sessions.delete(sessionID)
    }
    this.sessions.set(sessionID, history)
    history.push({ key: Bun.hash(signed), tool })
    if (history.length > HISTORY) history.splice(0, history.length - HISTORY)
    const found = detectCycle(history.map((entry) => entry.key))
    if (found === null) return null
    const block = history.slice(history.length - found.length).map((entry) => entry.tool)
    return { tools: block, repetitions: found.repetitions }
  }

  /** Forget a session (its run ended: the daemon's history is a run's too). */
  forget(sessionID: string): void {
    this.sessions.delete(sessionID)
  }

  /** The calls held for a session (for tests and bounds). */
  held(sessionID: string): number {
    return this.sessions.get(sessionID)?.length ?? 0
  }

  get size(): number {
    return this.sessions.size
  }
}

function cleanToolName(name: string): string {
  return name.replace(/[\p{C}\s]+/gu, " ").trim().slice(0, TOOL_NAME_MAX)
}

/**
 * What the model reads for a call the plugin's own rule refused (feedback.py rejection_text).
 * It starts with OWN_REFUSAL, so that a monitor reading the call back knows that no monitor
 * answered it: the refusal is the plugin's, which the acting monitor counts as its own.
 */
export const OWN_REFUSAL = `${MARK}this call was refused by the plugin and did not run`

// The step after a repeated call (feedback.py _CALL_STEP): the first instruction a small
// model reads is the one it follows.
export const STEP =
  "Its result is already above and will not change. Use it: if it answers the task, reply " +
  "to the person now without calling a tool; if not, make a call you have not made yet."

export function localFeedback(cycle: Cycle): string {
  const calls = cycle.tools.length === 1 ? "1 call" : `${cycle.tools.length} calls`
  const names = cycle.tools.map(cleanToolName).join(", ")
  return (
    `${OWN_REFUSAL}: it would have completed a loop, ` +
    `${calls} (${names}) repeated ${cycle.repetitions} times with the same arguments.\n\n` +
    STEP
  )
}

/** The text a daemon's block is refused with; a fallback when it sent none usable. */
export function blockText(feedback: unknown, tool: string): string {
  if (typeof feedback === "string" && feedback.trim()) return feedback
  return (
    `${MARK}this call (${cleanToolName(tool)}) was refused and did not run: it would have ` +
    `completed a loop of repeated calls.\n\n${STEP}`
  )
}

/**
 * The error a refused call throws. OpenCode shows a thrown error as `String(error)`, which
 * puts "Error: " before the message; with no name the text starts with the guard's mark.
 */
export function refusal(text: string): Error {
  const error = new Error(text)
  error.name = ""
  return error
}

/** The daemon's socket for the server at `serverUrl`: one per port (config.py plugin_socket). */
export function socketFor(dir: string, serverUrl: string): string | null {
  let url: URL
  try {
    url = new URL(serverUrl)
  } catch {
    return null
  }
  const port = url.port || (url.protocol === "https:" ? "443" : "80")
  return `${dir}/plugin-${port}.sock`
}

/**
 * What a 2.x server's process says of itself. OpenCode 2 gives a plugin no URL (`ctx.location`
 * has none, `ctx.app` is `{name, version, channel}`), but the plugin runs in the server's own
 * process: `process.pid` is the `pid` of its `/api/info`, and `process.argv` its command line
 * (seen on 2.2.5: `[bun, /$bunfs/root/opencode, serve, --port, 4596, ...]`).
 */
export type OwnProcess = {
  pid: number
  argv: readonly string[]
  env: Readonly<Record<string, string | undefined>>
}

/** The socket a daemon names after the pid of the server it watches (endpoint.py pid_link),
 * once that server's `/api/info` told it the pid. */
export function pidLink(dir: string, pid: number): string {
  return `${dir}/server-${pid}.sock`
}

const isPort = (text: string | undefined): number | null =>
  text !== undefined && /^\d{1,5}$/.test(text) && +text >= 1 && +text <= 65535 ? +text : null

/**
 * The port this server listens on, from what it was started with, or null: `serve --port N`
 * (or `--port=N`) says it; the background service every `opencode` command starts by itself
 * (`serve --service`, no port on its command line: 49374 by default, or as `opencode service
 * set port` said) is registered by OpenCode in $XDG_STATE_HOME/opencode/service.json with its
 * pid and URL, and counts only when that pid is this process (a registration of another
 * service, or a stale one, names another server). A plain `serve` listens on 4096, the port
 * `plugin install` names by default: null, and the socket install wrote is asked.
 * `read`: a file's text, null if unreadable.
 */
export function ownPort(own: OwnProcess, read: (path: string) => string | null): number | null {
  for (let i = 2; i < own.argv.length; i++) {
    const arg = own.argv[i]
    if (arg === "--") break
    if (arg === "--port") return isPort(own.argv[i + 1])
    if (arg.startsWith("--port=")) return isPort(arg.slice("--port=".length))
  }
  // Only the service is registered: any other process would read the file at every question.
  if (!own.argv.includes("--service")) return null
  const home = own.env.HOME
  const state = own.env.XDG_STATE_HOME || (home ? `${home}/.local/state` : null)
  const text = state ? read(`${state}/opencode/service.json`) : null
  if (text === null) return null
  try {
    const service = JSON.parse(text) as { pid?: unknown; url?: unknown }
    if (service?.pid !== own.pid || typeof service.url !== "string") return null
    const url = new URL(service.url)
    return isPort(url.port || (url.protocol === "https:" ? "443" : "80"))
  } catch {
    return null
  }
}

/**
 * Where a 2.x plugin asks, looked up at each question (a daemon may start after the server),
 * or null when nothing says (then the socket written at install). First the socket a daemon
 * named after this process's pid: it read that pid from the server's `/api/info`, so it
 * watches this very server whatever its port or the URL it was given (a mapped port, `--port
 * 0`); `realpath` gives the socket it leads to, whose folder is checked (untrustedSocket), and
 * a link whose socket is gone is passed over. Then the socket named after the port this
 * process listens on (`ownPort`), the one a daemon given this server's URL listens on.
 */
export function ownSocket(
  dir: string,
  own: OwnProcess,
  read: (path: string) => string | null = readText,
): () => string | null {
  let port: number | null = null
  return () => {
    try {
      return realpathSync(pidLink(dir, own.pid))
    } catch {
      // No daemon named this server by its pid (yet): its port says which daemon watches it.
    }
    // Not cached while unknown: the service may register itself after its plugins load.
    port ??= ownPort(own, read)
    return port === null ? null : `${dir}/plugin-${port}.sock`
  }
}

function readText(path: string): string | null {
  try {
    return readFileSync(path, "utf8")
  } catch {
    return null
  }
}

/** The session a 1.x event ends the run of, or null. */
export function endedSession(event: { type?: unknown; properties?: any } | undefined): string | null {
  if (event?.type === "session.idle") return event.properties?.sessionID ?? null
  if (event?.type === "session.deleted") return event.properties?.info?.id ?? null
  return null
}

/** Sessions whose model step is remembered, at most (the least recently noted forgotten first). */
export const MAX_STEPS = 1024

/**
 * The model step (assistant message) each session is in, from the server's own events, which
 * reach the plugin before the call runs: the daemon reads them on a stream that may lag, and
 * took a call of the next step, asked first, for one of the step before (one burst). The
 * step is the session's, not the call's: call ids repeat from step to step (local models
 * send call_0, call_1, ... at every step), so a call asked before its own part's event came
 * was named by the step of an earlier call with its id (issue 43: a loop in the next run
 * taken for a new one, and held). A session runs one step at a time, and its calls are asked
 * about within it.
 */
export class Steps {
  private readonly steps = new Map<string, string>()

  note(event: { type?: unknown; properties?: any } | undefined): void {
    let sessionID: unknown
    let messageID: unknown
    if (event?.type === "message.part.updated" && event.properties?.part?.type === "tool") {
      ;({ sessionID, messageID } = event.properties.part)
    } else if (event?.type === "message.updated" && event.properties?.info?.role === "assistant") {
      ;({ sessionID, id: messageID } = event.properties.info)
    }
    if (typeof sessionID !== "string" || typeof messageID !== "string") return
    if (this.steps.get(sessionID) === messageID) return
    this.steps.delete(sessionID) // re-inserted last: the least recent goes first
    if (this.steps.size >= MAX_STEPS) this.steps.delete(this.steps.keys().next().value as string)
    this.steps.set(sessionID, messageID)
  }

  of(sessionID: string): string | undefined {
    return this.steps.get(sessionID)
  }
}

/**
 * Why the socket at `path` may be another user's, or null when it is the daemon's: the
 * socket and its folder belong to this user (or root), and no one else can write in the
 * folder. A socket another user put there would be asked, and its answers shown to the model
 * (the daemon refuses such a folder too, decide.py open_folder). `uid`: this process's.
 */
export function untrustedSocket(path: string, uid: number): string | null {
  for (const [what, where] of [["folder", dirname(path)], ["socket", path]] as const) {
    let info: { uid: number; mode: number }
    try {
      info = statSync(where)
    } catch (err) {
      if ((err as { code?: unknown })?.code === "ENOENT") return null // nothing listens: said by fetch
      return `cannot check the ${what} ${where} (${String(err)})`
    }
    if (info.uid !== uid && info.uid !== 0) return `the ${what} ${where} belongs to another user (uid ${info.uid})`
    if (what === "folder" && info.mode & 0o022) {
      return `others can write in the folder ${where} (mode ${(info.mode & 0o777).toString(8)})`
    }
  }
  return null
}

/**
 * Why a socket the lookup found (`ownSocket`) is not the daemon's, or null: a daemon names
 * this server's pid with a link inside its folder to its own socket there (endpoint.py
 * pid_link, relative and whole), so a link leading anywhere else is not of its making.
 */
export function outsideFolder(path: string, dir: string): string | null {
  let real = dir
  try {
    real = realpathSync(dir)
  } catch {
    // No folder: nothing in it listens, as fetch will say.
  }
  const parent = dirname(path)
  return parent === dir || parent === real ? null : `the socket ${path} is outside the folder ${dir}`
}

const hmac = (token: string, kind: string, nonce: string, body: Uint8Array): Buffer =>
  createHmac("sha256", token).update(`${kind} ${nonce}\n`).update(body).digest()

/** The Authorization header of a signed question, and the proof its answer must carry
 * (monitor/core/plugin_protocol.py): the token itself never leaves the process. */
export function signQuestion(token: string, body: Uint8Array, nonce = randomBytes(16).toString("hex")) {
  return {
    authorization: `OLM-HMAC ${nonce} ${hmac(token, "question", nonce, body).toString("hex")}`,
    proves: (answer: Uint8Array, proof: string | null): boolean => {
      if (proof === null || !/^[0-9a-f]{64}$/.test(proof)) return false
      return timingSafeEqual(Buffer.from(proof, "hex"), hmac(token, "answer", nonce, answer))
    },
  }
}

export const PROOF_HEADER = "X-Loop-Monitor-Proof"

// What Bun's fetch reports when no one listens at a socket or port.
const NOTHING_LISTENS = new Set(["FailedToOpenSocket", "ConnectionRefused", "ENOENT", "ECONNREFUSED"])

type Verdict = { block: string | null } | { fellOpen: string }
type Asker = (body: Record<string, unknown>, tool: string) => Promise<Verdict>

/**
 * What the server's log says when the daemon at `where` is of another release than this
 * plugin, from the version it answers with (`header`, null when it says none: a daemon from
 * before versions, which refuses this plugin's questions), or null when both are one release.
 */
export function versionSkew(header: string | null, where: string): string | null {
  if (header === null) {
    return (
      `opencode-loop-monitor: the monitor at ${where} says no version: it is of an earlier ` +
      `release than this plugin (${VERSION}); restart it (\`opencode-loop-monitor watch\`, or its service)`
    )
  }
  const [theirs, ...rest] = header.split(";").map((part) => part.trim())
  if (theirs === VERSION) return null
  const protocol = Number(/^protocol=(\d+)$/.exec(rest.join(";"))?.[1] ?? NaN)
  const advice =
    protocol < PROTOCOL
      ? "restart the monitor with the release that installed this plugin"
      : "run `opencode-loop-monitor plugin install` and restart OpenCode"
  return `opencode-loop-monitor: this plugin is version ${VERSION}, the monitor at ${where} ${theirs}: ${advice}`
}

/** Asks the daemon at `endpoint`; at most WAIT_MS. The block text, null to allow, or why
 * it fell open (then the caller's own rule decides). A daemon of another release is said
 * in `log`, once until it answers with another version. Its socket: the one of the server at
 * `serverUrl` (1.x), else the one `own` finds at each question (2.x, `ownSocket`), else the
 * socket written at install. */
export function makeAsker(
  endpoint: Endpoint,
  serverUrl: string | null,
  log: (line: string) => void = console.error,
  own: (() => string | null) | null = null,
): Asker {
  const installed =
    endpoint.socketDir && serverUrl ? socketFor(endpoint.socketDir, serverUrl) : endpoint.socket
  const readToken = (): string | null => {
    if (!endpoint.tokenFile) return null
    try {
      return readFileSync(endpoint.tokenFile, "utf8").trim()
    } catch {
      return null
    }
  }
  let token = readToken()
  const uid = process.getuid?.() ?? -1
  // The version the daemon answered with last (undefined: none yet): a change is said once.
  let version: string | null | undefined = undefined
  return async (body: Record<string, unknown>, tool: string): Promise<Verdict> => {
    const found = endpoint.socketDir && !serverUrl ? own?.() : null
    const socket = found || installed
    const where = socket ?? endpoint.url
    if (socket) {
      const untrusted = (found ? outsideFolder(found, endpoint.socketDir!) : null) ?? untrustedSocket(socket, uid)
      if (untrusted !== null) return { fellOpen: `not asked: ${untrusted}, so it may not be the monitor's` }
    }
    const headers: Record<string, string> = { "Content-Type": "application/json" }
    let sent: Uint8Array
    try {
      sent = new TextEncoder().encode(JSON.stringify(body))
    } catch (err) {
      return { fellOpen: `the call cannot be written as JSON (${String(err)})` }
    }
    // Over TCP whoever holds the port while the daemon is down gets the question: it is
    // signed, never sent with the token, and only an answer proven with the token counts.
    const signed = !socket && token ? signQuestion(token, sent) : null
    if (signed) headers.Authorization = signed.authorization
    let status: number
    let answer: { verdict?: unknown; feedback?: unknown; error?: unknown } | null
    let proven = true
    try {
      const response = await fetch(endpoint.url, {
        method: "POST",
        headers,
        body: sent,
        signal: AbortSignal.timeout(WAIT_MS),
        ...(socket ? { unix: socket } : {}),
      } as RequestInit)
      status = response.status
      const theirs = response.headers.get(VERSION_HEADER)
      if (theirs !== version) {
        version = theirs
        const skew = versionSkew(theirs, where)
        if (skew !== null) log(skew)
      }
      const text = new Uint8Array(await response.arrayBuffer())
      if (signed) proven = signed.proves(text, response.headers.get(PROOF_HEADER))
      answer = JSON.parse(new TextDecoder().decode(text))
    } catch (err) {
      // Bun's own text for these asks whether the URL has a typo: say what it means here.
      const { name, code } = (err ?? {}) as { name?: unknown; code?: unknown }
      const why = NOTHING_LISTENS.has(String(code))
        ? "nothing listens there: is `opencode-loop-monitor watch` running for this server?"
        : `${String(name ?? err)}${code ? ` ${String(code)}` : ""}`
      return { fellOpen: `no answer from the monitor at ${where} (${why})` }
    }
    if (status === 401) token = readToken() // the daemon may have a new token
    if (status !== 200 || answer === null || typeof answer !== "object") {
      return { fellOpen: `the monitor at ${where} refused: ${status} ${answer?.error}` }
    }
    if (!proven) {
      // Whatever it says, it is not known to be the monitor: its text never reaches the model.
      return { fellOpen: `the answer from ${where} is not proven with the token (not the monitor's?)` }
    }
    if (answer.verdict === "block") return { block: blockText(answer.feedback, tool) }
    if (answer.verdict === "allow") return { block: null }
    return { fellOpen: `the monitor at ${where} answered no verdict` }
  }
}

/**
 * One call's judgement, shared by both entries: the daemon's verdict when it answers, else
 * the plugin's own rule. Returns the text to refuse the call with, or null to let it run.
 */
export function makeJudge(
  ask: Asker,
  directory: string,
  log: (line: string) => void = console.error,
) {
  const guard = new LocalGuard()
  const steps = new Steps()
  const warned = new Set<string>()
  let fellOpen = 0
  // `messageID`: the model step the call is of, where the hook names it (2.x); else the one
  // the server's events last named (1.x, `steps`).
  const judge = async (
    sessionID: string,
    callID: string,
    tool: string,
    args: unknown,
    messageID?: string,
  ): Promise<string | null> => {
    let cycle: Cycle | null = null
    let cut = false
    try {
      const signed = signature(tool, args)
      cut = isCut(signed)
      cycle = guard.record(sessionID, tool, signed)
    } catch (err) {
      // A fault of ours (arguments no JSON has, say) must not refuse the call: it is asked.
      log(`opencode-loop-monitor: the plugin's own rule failed on a call of ${tool} (${err})`)
    }
    // The count goes with this request, taken from the total at once: calls asked about
    // together (a step's parallel calls) would each report, and each subtract, the same
    // calls, and the total fall below zero. Given back if the daemon did not count them.
    const reported = fellOpen
    fellOpen = 0
    // Arguments past the bound are not sent (`args_cut`, below): the daemon could not take
    // them (413) or only slowly (nested past what json.loads reads), and writing them out
    // would cost what the bound saves.
    const body: Record<string, unknown> = {
      session_id: sessionID,
      call_id: callID,
      tool,
      ...(cut ? { args_cut: true } : { args: args ?? {} }),
      directory,
      fell_open: reported,
      plugin_version: VERSION,
      protocol: PROTOCOL,
    }
    const step = typeof messageID === "string" && messageID ? messageID : steps.of(sessionID)
    if (step !== undefined) body.message_id = step
    let verdict: Verdict
    let answered = false // the daemon took this request's count
    if (cut) {
      // The daemon is still told of the call, without its arguments: so it knows this
      // session's plugin asks, and counts a refusal by the rule below as its block instead
      // of aborting the run; it reads the arguments on the stream, and refuses the call if
      // the loop it completes was found there first. Else the rule below decides.
      const told = await ask(body, tool)
      if ("block" in told && told.block !== null) return told.block
      answered = "block" in told
      verdict = { fellOpen: `the arguments of this ${cleanToolName(tool)} call are too large to ask about` }
    } else {
      verdict = await ask(body, tool)
    }
    if ("block" in verdict) return verdict.block
    if (!answered) fellOpen += reported // reported again with the next request
    if (!warned.has(sessionID)) {
      if (warned.size >= MAX_WARNED) warned.clear()
      warned.add(sessionID)
      log(
        `opencode-loop-monitor: ${verdict.fellOpen}; the calls of session ${sessionID} are ` +
          "checked by the plugin's own loop rule while it lasts",
      )
    }
    if (cycle !== null) return localFeedback(cycle)
    fellOpen += 1
    return null
  }
  return { judge, guard, steps }
}

/** The 1.x hooks around a judge: `tool.execute.before` throws to refuse; idle clears. */
export function v1Hooks({ judge, guard, steps }: ReturnType<typeof makeJudge>) {
  return {
    "tool.execute.before": async (
      input: { tool: string; sessionID: string; callID: string },
      output: { args: unknown },
    ): Promise<void> => {
      const refused = await judge(input.sessionID, input.callID, input.tool, output.args)
      if (refused !== null) throw refusal(refused)
    },
    event: async ({ event }: { event: { type?: unknown; properties?: any } }): Promise<void> => {
      steps.note(event)
      const ended = endedSession(event)
      if (ended !== null) guard.forget(ended)
    },
  }
}

/** The 1.x entry. OpenCode gives the URL it serves on (`serverUrl`): the daemon's socket. */
async function server(ctx: { directory: string; serverUrl?: URL | string }) {
  let serverUrl: string | null = null
  try {
    serverUrl = ctx.serverUrl ? String(ctx.serverUrl) : null
  } catch {
    serverUrl = null // a getter of an older release may throw: ask where install said
  }
  return v1Hooks(makeJudge(makeAsker(ENDPOINT, serverUrl), ctx.directory))
}

/** The parts of a 2.x plugin context this plugin uses (`@opencode/plugin` Context). */
export type V2Context = {
  location?: { directory?: string }
  tool: { hook: (name: "execute.before", callback: (event: V2ToolEvent) => Promise<void>) => Promise<unknown> }
  permission: { hook: (name: "evaluate", callback: (event: V2PermissionEvent) => Promise<void>) => Promise<unknown> }
}
export type V2ToolEvent = { tool: string; sessionID: string; id: string; input: unknown; messageID?: string }
export type V2PermissionEvent = {
  sessionID: string
  source?: { type?: string; id?: string; callID?: string }
  effect: string
  message?: string
}

// Refusals waiting for their call's permission check, bounded like the sessions.
const MAX_PENDING = 1024

/**
 * The 2.x hooks. 2.x documents no way for `execute.before` to refuse a call (a thrown error
 * is a defect there, not a tool error); it documents `permission.hook("evaluate")` setting
 * `effect = "deny"` with a `message`, which becomes the denial the model reads. So the call
 * is judged in `execute.before` (which has its input) and denied at its permission check.
 */
export async function v2Hooks(ctx: V2Context, ask: Asker): Promise<void> {
  const { judge } = makeJudge(ask, ctx.location?.directory ?? "/")
  const pending = new Map<string, string>()
  await ctx.tool.hook("execute.before", async (event) => {
    // The step is said with each question: a question that overtakes the stream's events
    // of its step is not taken for one of the step before (seen at a load of 8: the ladder
    // climbed a call late).
    const refused = await judge(event.sessionID, event.id, event.tool, event.input, event.messageID)
    if (refused === null) return
    if (pending.size >= MAX_PENDING) pending.delete(pending.keys().next().value as string)
    pending.set(`${event.sessionID} ${event.id}`, refused)
  })
  await ctx.permission.hook("evaluate", async (event) => {
    const call = event.source?.id ?? event.source?.callID
    if (call === undefined) return
    const key = `${event.sessionID} ${call}`
    const refused = pending.get(key)
    if (refused === undefined) return
    pending.delete(key)
    event.effect = "deny"
    event.message = refused
  })
}

/** The 2.x entry: its context carries no server URL, so with a folder of sockets the plugin
 * finds its own server's daemon from its process (`ownSocket`), else asks where install said. */
async function setup(ctx: V2Context): Promise<void> {
  const own = ENDPOINT.socketDir ? ownSocket(ENDPOINT.socketDir, process) : null
  await v2Hooks(ctx, makeAsker(ENDPOINT, null, console.error, own))
}

export default { id: "opencode-loop-monitor", server, setup }
