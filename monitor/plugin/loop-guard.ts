/**
 * opencode-loop-monitor's OpenCode plugin: before every tool call it asks the monitor's
 * daemon whether the call completes a loop, and blocks the call when the daemon says so.
 * A blocked call never runs: its part ends in `error` with the daemon's feedback, the model
 * reads that as the call's result, and its run goes on.
 *
 * It fails open: when the daemon is not there, slow or answers nonsense, the call runs after
 * at most WAIT_MS (at once when nothing listens), and the server's log says so once per
 * session. The calls let through that way are reported with the next answered request.
 *
 * Installed by `opencode-loop-monitor plugin install`, which writes ENDPOINT below. OpenCode
 * loads every file in its plugins folder at start and treats each export as a plugin, so
 * this file exports one function and nothing else. No package needed: Bun runs it as it is.
 */
import { readFileSync } from "node:fs"

// Where the daemon listens; written by `opencode-loop-monitor plugin install`.
const ENDPOINT: { url: string; socket: string | null; tokenFile: string | null } = {"url": "http://localhost/v1/decide", "socket": null, "tokenFile": null}
// The longest a call waits for the daemon before it runs unchecked.
const WAIT_MS = 200
// Sessions already warned about, bounded: a server can run for weeks.
const MAX_WARNED = 1000

function readToken(): string | null {
  if (!ENDPOINT.tokenFile) return null
  try {
    return readFileSync(ENDPOINT.tokenFile, "utf8").trim()
  } catch {
    return null
  }
}

export const OpencodeLoopMonitor = async (ctx: { directory: string }) => {
  let token = readToken()
  let fellOpen = 0
  const warned = new Set<string>()
  const where = ENDPOINT.socket ?? ENDPOINT.url

  function fallOpen(sessionID: string, why: string): void {
    fellOpen += 1
    if (warned.has(sessionID)) return
    if (warned.size >= MAX_WARNED) warned.clear()
    warned.add(sessionID)
    console.error(
      `opencode-loop-monitor: ${why}; calls of session ${sessionID} run unchecked while it lasts`,
    )
  }

  return {
    "tool.execute.before": async (
      input: { tool: string; sessionID: string; callID: string },
      output: { args: unknown },
    ): Promise<void> => {
      const reported = fellOpen
      const headers: Record<string, string> = { "Content-Type": "application/json" }
      if (token) headers.Authorization = `Bearer ${token}`
      let status: number
      let answer: { verdict?: unknown; feedback?: unknown; error?: unknown } | null
      try {
        const response = await fetch(ENDPOINT.url, {
          method: "POST",
          headers,
          body: JSON.stringify({
            session_id: input.sessionID,
            call_id: input.callID,
            tool: input.tool,
            args: output.args ?? {},
            directory: ctx.directory,
            fell_open: reported,
          }),
          signal: AbortSignal.timeout(WAIT_MS),
          ...(ENDPOINT.socket ? { unix: ENDPOINT.socket } : {}),
        } as RequestInit)
        status = response.status
        answer = await response.json()
      } catch (err) {
        fallOpen(input.sessionID, `no answer from the monitor at ${where} (${err})`)
        return
      }
      if (status === 401) token = readToken() // the daemon may have a new token
      if (status !== 200 || answer === null || typeof answer !== "object") {
        fallOpen(input.sessionID, `the monitor at ${where} refused: ${status} ${answer?.error}`)
        return
      }
      fellOpen -= reported // the daemon counted them
      if (answer.verdict === "block" && typeof answer.feedback === "string") {
        throw new Error(answer.feedback)
      }
      if (answer.verdict !== "allow") {
        fallOpen(input.sessionID, `the monitor at ${where} answered no verdict`)
      }
    },
  }
}
