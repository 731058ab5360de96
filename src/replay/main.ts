// `kv-router replay`: replays a Mooncake-format trace against a router (issue #7).
export async function replayMain(_argv: string[]): Promise<void> {
  process.stderr.write('kv-router replay: not available in this build yet (issue #7)\n')
  process.exitCode = 2
}
