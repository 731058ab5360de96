// Polls a condition until it holds or a deadline passes; the failure names what was awaited.
export async function waitUntil(what: string, cond: () => boolean | Promise<boolean>, timeoutMs = 10_000, stepMs = 10): Promise<void> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await cond()) return
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await new Promise((r) => setTimeout(r, stepMs))
  }
}
