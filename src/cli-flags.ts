// Small flag readers shared by the `mocker` and `replay` commands (`serve` has the full config
// module): `--name value` or `--name=value`; a bad value exits 2 with one line naming it.

export function die(line: string): never {
  process.stderr.write(`kv-router: ${line}\n`)
  process.exit(2)
}

export function flagValue(argv: string[], name: string): string | undefined {
  const i = argv.findIndex((a) => a === name || a.startsWith(`${name}=`))
  if (i < 0) return undefined
  const a = argv[i] as string
  return a.includes('=') ? a.slice(a.indexOf('=') + 1) : argv[i + 1]
}

export function intFlag(cmd: string, argv: string[], name: string, dflt: number, min: number, max: number): number {
  const v = flagValue(argv, name)
  if (v === undefined) return dflt
  const n = Number(v)
  if (!/^[0-9]+$/.test(v) || n < min || n > max) die(`${cmd}: ${name} must be an integer in [${min}, ${max}], got ${JSON.stringify(v)}`)
  return n
}

