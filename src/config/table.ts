// One table per command: each option defined once, with its names, environment variables, type,
// default, range, help line and docs row. The parser, `--help`, docs/configuration.md and the
// type of the parsed configuration all come from the table. It imports nothing of the router, so
// every layer that holds options (the scheduler's, the serve command's) can define its rows here.
import { KvrError } from '../errors.js'

/** An invalid command line or environment: the message is the one line the CLI prints. */
export class ConfigError extends Error {
  override name = 'ConfigError'
}

export type OptionKind = 'int' | 'num' | 'bool' | 'enum' | 'str'

/** When an option given on the command line or in the environment does nothing. */
export interface NoEffect {
  /** The option has no effect while every one of these options holds the value named. */
  readonly when: Readonly<Record<string, unknown>>
  /** What the warning says after the option's name. */
  readonly says: string
}

export interface OptionDef {
  /** The option's name on the command line; '' for an option that only code sets. */
  readonly flag: string
  /** Its field in the parsed configuration. */
  readonly key: string
  readonly kind: OptionKind
  /** Used when it is given nowhere; null = unset. */
  readonly dflt: unknown
  /** Variables read when the command line does not give it; of several, the first set wins. */
  readonly env?: readonly string[]
  readonly aliases?: readonly string[]
  /** int, num: the range; with openMin the lower bound itself is refused. */
  readonly min?: number
  readonly max?: number
  readonly openMin?: boolean
  /** enum: the values taken. */
  readonly values?: readonly string[]
  /** "none" (also "null", "off") unsets it. */
  readonly nullable?: boolean
  /** bool: given alone only, `--flag` (no `--no-flag`, no value). */
  readonly flagOnly?: boolean
  /** The value's name in --help (N, URL, …). */
  readonly metavar?: string
  /** Reads a value the kind alone does not say (undefined = refused); `prev` is the value so far. */
  readonly read?: (text: string, prev: unknown) => unknown
  /** What a refused value should have been, when the kind's own words do not say it. */
  readonly accepts?: string
  /** The --help line. */
  readonly help: string
  /** The docs row's text, when longer than the help line. */
  readonly doc?: string
  /** The docs row's default, when the value alone does not say it. */
  readonly docDefault?: string
  /** The --help heading of the group the option starts. */
  readonly group?: string
  readonly noEffect?: NoEffect
}

/** A row of the table, its literal types kept so that the configuration's type follows them. */
export function opt<const D extends OptionDef>(d: D): D {
  return d
}

type Unset<D> = D extends { dflt: null } ? null : D extends { nullable: true } ? null : never
type Exclusive<R> = Exclude<R, undefined>

/** The type of one option's value. */
export type ValueOf<D> = D extends { read: (text: string, prev: unknown) => infer R }
  ? Exclusive<R> | Unset<D>
  : D extends { kind: 'enum'; values: readonly (infer V)[] }
    ? V | Unset<D>
    : D extends { kind: 'int' | 'num' }
      ? number | Unset<D>
      : D extends { kind: 'bool' }
        ? boolean
        : string | Unset<D>

/** The parsed configuration of a table: one read-only field per row. */
export type ConfigOf<T extends readonly OptionDef[]> = { readonly [D in T[number] as D['key']]: ValueOf<D> }

/** A command's table and the words of its messages. */
export interface CommandTable {
  /** `kv-router NAME`, for messages. */
  readonly command: string
  readonly options: readonly OptionDef[]
  /** The line for an argument that is no option. */
  readonly unknown: (arg: string) => string
}

/** The result of a parse: the values, and which options were given (the name used, CLI or env). */
export interface Parsed<C> {
  readonly config: C
  /** key → the flag, alias or variable it was given by. */
  readonly given: ReadonlyMap<string, string>
}

/**
 * Decimal digits with an optional "-", in [min, max]; undefined otherwise. Number() alone would
 * also take "0x10", "0b11", "1e3" and "", which no flag means.
 */
export function parseIntArg(text: string, min: number, max: number): number | undefined {
  const t = text.trim()
  if (!/^-?[0-9]+$/.test(t)) return undefined
  const v = Number(t)
  return Number.isSafeInteger(v) && v >= min && v <= max ? v : undefined
}

/** A finite decimal number (sign, digits, ".", exponent) in [min, max]; undefined otherwise. */
export function parseNumArg(text: string, min: number, max: number): number | undefined {
  const t = text.trim()
  if (t === '' || !/^[-+0-9.eE]+$/.test(t)) return undefined
  const v = Number(t)
  return Number.isFinite(v) && v >= min && v <= max ? v : undefined
}

const UNSET = new Set(['none', 'null', 'off'])

/** What a value of the option must be, as the messages and --help say it. */
export function accepts(d: OptionDef): string {
  if (d.accepts !== undefined) return d.accepts
  const unset = d.nullable === true ? ' or "none"' : ''
  const lo = `${d.openMin === true ? '(' : '['}${d.min ?? 0}`
  switch (d.kind) {
    case 'int':
      return `an integer in ${lo}, ${d.max ?? '∞'}]${unset}`
    case 'num':
      return `a number in ${lo}, ${d.max ?? '∞'}]${unset}`
    case 'bool':
      return 'true or false'
    case 'enum':
      return `one of ${(d.values ?? []).join('|')}${unset}`
    default:
      return 'a non-empty string'
  }
}

/** One text value of the option; undefined when refused. Throws ConfigError from a `read` that explains. */
function convert(d: OptionDef, raw: string, prev: unknown): unknown {
  const t = raw.trim()
  if (d.nullable === true && UNSET.has(t)) return null
  if (d.read !== undefined) return d.read(t, prev)
  switch (d.kind) {
    case 'int': {
      const v = parseIntArg(t, d.min ?? 0, d.max ?? Number.MAX_SAFE_INTEGER)
      return v === undefined || (d.openMin === true && v === d.min) ? undefined : v
    }
    case 'num': {
      const v = parseNumArg(t, d.min ?? 0, d.max ?? Infinity)
      return v === undefined || (d.openMin === true && v === d.min) ? undefined : v
    }
    case 'bool': {
      const l = t.toLowerCase()
      if (l === 'true' || l === '1' || l === 'yes' || l === 'on') return true
      if (l === 'false' || l === '0' || l === 'no' || l === 'off') return false
      return undefined
    }
    case 'enum':
      return (d.values ?? []).includes(t) ? t : undefined
    default:
      return t === '' ? undefined : t
  }
}

function read(where: string, d: OptionDef, raw: string, prev: unknown): unknown {
  let v: unknown
  try {
    v = convert(d, raw, prev)
  } catch (err) {
    // a reader that says why (a --worker key that does not fit), named after where the value came from
    if (err instanceof ConfigError) throw new ConfigError(`${where}: ${err.message}`)
    throw err
  }
  if (v === undefined) throw new ConfigError(`${where} must be ${accepts(d)}, got ${JSON.stringify(raw)}`)
  return v
}

function namesOf(table: CommandTable): Map<string, OptionDef> {
  const byName = new Map<string, OptionDef>()
  for (const d of table.options) {
    if (d.flag === '') continue
    byName.set(d.flag, d)
    for (const a of d.aliases ?? []) byName.set(a, d)
  }
  return byName
}

/**
 * A command's options from argv (after the command's name) and the environment; 'help' for
 * --help. The command line wins: a variable its option is given there is not read at all, so a
 * stale or wrong one left in the environment cannot stop a command whose line says otherwise.
 * Throws ConfigError with the one line to print.
 */
export function parseOptions<C>(table: CommandTable, argv: readonly string[], env: NodeJS.ProcessEnv = {}): Parsed<C> | 'help' {
  const out: Record<string, unknown> = {}
  for (const d of table.options) out[d.key] = d.dflt
  const given = new Map<string, string>()
  const byName = namesOf(table)
  // --help wins over whatever else the line holds, valid or not
  if (argv.includes('--help') || argv.includes('-h')) return 'help'
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i] as string
    const eq = arg.startsWith('--') ? arg.indexOf('=') : -1
    const name = eq > 0 ? arg.slice(0, eq) : arg
    let d = byName.get(name)
    let negated = false
    if (d === undefined && name.startsWith('--no-')) {
      d = byName.get(`--${name.slice(5)}`)
      negated = d?.kind === 'bool' && d.flagOnly !== true
      if (!negated) d = undefined
    }
    if (d === undefined) throw new ConfigError(table.unknown(name))
    // repeated: the values so far, else (the first time) from the start
    const prev = given.has(d.key) ? out[d.key] : d.dflt
    given.set(d.key, name)
    if (negated || (d.flagOnly === true && eq < 0)) {
      if (eq > 0) throw new ConfigError(`${name} takes no value`)
      out[d.key] = !negated
      continue
    }
    if (d.flagOnly === true) throw new ConfigError(`${name} takes no value`)
    let raw: string
    const next = argv[i + 1]
    if (eq > 0) raw = arg.slice(eq + 1)
    else if (d.kind === 'bool' && (next === undefined || next.startsWith('--'))) raw = 'true'
    else {
      if (next === undefined) throw new ConfigError(`${name} needs a value: ${accepts(d)}`)
      // `--http-host --http-port 80` forgot the host; a value that really starts with "--" can
      // be given as NAME=VALUE
      if (next.startsWith('--') && next.length > 2)
        throw new ConfigError(`${name} needs a value (${accepts(d)}), got the option ${next}; write ${name}=VALUE for a value that starts with --`)
      raw = next
      i++
    }
    out[d.key] = read(name, d, raw, prev)
  }
  for (const d of table.options) {
    if (given.has(d.key)) continue
    // of several names for one option, the first listed wins; each one set must still be valid
    for (const name of [...(d.env ?? [])].reverse()) {
      const raw = env[name]
      if (raw === undefined || raw === '') continue
      out[d.key] = read(`${name} (${d.flag})`, d, raw, d.dflt)
      given.set(d.key, name)
    }
  }
  return { config: out as C, given }
}

/**
 * The warnings for options given where they do nothing (Dynamo deployments set many by env for
 * every router): one line per option given whose table row says when it has no effect.
 */
export function withoutEffect(table: CommandTable, config: Readonly<Record<string, unknown>>, given: ReadonlyMap<string, string>): string[] {
  const out: string[] = []
  for (const d of table.options) {
    const by = given.get(d.key)
    if (by === undefined || d.noEffect === undefined) continue
    if (!Object.entries(d.noEffect.when).every(([k, v]) => config[k] === v)) continue
    out.push(`${d.flag}${by !== d.flag && (d.aliases ?? []).includes(by) ? ` (${by})` : ''} ${d.noEffect.says}`)
  }
  return out
}

function shownDefault(d: OptionDef): string | null {
  if (d.dflt === null || d.dflt === undefined || (Array.isArray(d.dflt) && d.dflt.length === 0)) return null
  return String(d.dflt)
}

/** The options part of a command's --help: names, help, default, what it accepts, variables. */
export function optionsHelp(table: CommandTable): string {
  const lines: string[] = []
  for (const d of table.options) {
    if (d.flag === '') continue
    if (d.group !== undefined) lines.push('', `${d.group}:`)
    const first =
      d.kind === 'bool'
        ? d.flagOnly === true
          ? d.flag
          : `${d.flag}, --no-${d.flag.slice(2)}`
        : `${d.flag} ${d.metavar ?? (d.kind === 'int' ? 'N' : d.kind === 'num' ? 'X' : 'V')}`
    lines.push(`  ${[first, ...(d.aliases ?? [])].join(', ')}`)
    const dflt = d.flagOnly === true ? null : shownDefault(d)
    const env = d.env !== undefined && d.env.length > 0 ? `; env ${d.env.join(', ')}` : ''
    lines.push(`      ${d.help}${dflt === null ? '' : ` (default ${dflt})`}${d.flagOnly === true ? '' : `; ${accepts(d)}`}${env}`)
  }
  lines.push('  -h, --help')
  return lines.join('\n') + '\n'
}

function capital(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1)
}

/** The table of a command in docs/configuration.md: flag, variables, default, meaning. */
export function docsTable(table: CommandTable): string {
  const rows = ['| flag | env | default | meaning |', '|---|---|---|---|']
  for (const d of table.options) {
    if (d.flag === '') continue
    const env = d.env === undefined || d.env.length === 0 ? '—' : d.env.map((e) => `\`${e}\``).join(', ')
    const dflt = d.docDefault ?? (shownDefault(d) === null ? 'unset' : `\`${shownDefault(d)}\``)
    let text = d.doc ?? `${capital(d.help)}.`
    for (const a of d.aliases ?? []) text += ` alias: \`${a}\`.`
    rows.push(`| \`${d.flag}\` | ${env} | ${dflt} | ${text} |`)
  }
  return rows.join('\n') + '\n'
}

function describe(v: unknown): string {
  if (typeof v === 'string') return JSON.stringify(v)
  if (typeof v === 'bigint') return `${v}n`
  return String(v)
}

/** An option handed in by code, checked as its row says; throws KvrError(KVR_ERR_INVALID_OPTION) naming `options.NAME`. */
export function checkValue(name: string, d: OptionDef, v: unknown): unknown {
  const bad = (expected: string): never => {
    throw new KvrError('KVR_ERR_INVALID_OPTION', `options.${name} must be ${expected}, got ${describe(v)}`)
  }
  if (v === null && (d.nullable === true || d.dflt === null)) return null
  const lo = `${d.openMin === true ? '(' : '['}${d.min ?? 0}`
  const hi = d.max === undefined || d.max === Infinity ? '∞)' : `${d.max}]`
  const inRange = (x: number): boolean => x >= (d.min ?? 0) && x <= (d.max ?? Infinity) && !(d.openMin === true && x === d.min)
  switch (d.kind) {
    case 'int':
      if (typeof v !== 'number' || !Number.isInteger(v) || !inRange(v)) bad(`an integer in ${lo}, ${hi}`)
      return v
    case 'num':
      if (typeof v !== 'number' || !Number.isFinite(v) || !inRange(v)) bad(`a number in ${lo}, ${hi}`)
      return v
    case 'bool':
      if (typeof v !== 'boolean') bad('a boolean')
      return v
    case 'enum':
      if (typeof v !== 'string' || !(d.values ?? []).includes(v)) bad(`one of ${(d.values ?? []).join('|')}`)
      return v
    default:
      if (typeof v !== 'string') bad('a string')
      return v
  }
}

/**
 * Options handed in by code (`input`, any of them left out), checked and completed from the rows'
 * defaults, frozen; `what` names them in the message for a key no row has. Throws KvrError(KVR_ERR_INVALID_OPTION) for a key no row has or a bad value.
 */
export function resolveValues<C>(rows: readonly OptionDef[], input: Readonly<Record<string, unknown>>, what: string, prefix = ''): C {
  if (input === null || typeof input !== 'object')
    throw new KvrError('KVR_ERR_INVALID_OPTION', `options${prefix === '' ? '' : `.${prefix.slice(0, -1)}`} must be an object, got ${describe(input)}`)
  const byKey = new Map(rows.map((d) => [d.key, d]))
  for (const k of Object.keys(input)) if (!byKey.has(k)) throw new KvrError('KVR_ERR_INVALID_OPTION', `options.${prefix}${k} is not a ${what}`)
  const out: Record<string, unknown> = {}
  for (const d of rows) out[d.key] = input[d.key] === undefined ? d.dflt : checkValue(prefix + d.key, d, input[d.key])
  return Object.freeze(out) as C
}
