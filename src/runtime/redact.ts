// What no output of the router may show: the --api-key, and the credentials of URLs
// (`nats://user:pass@host`, a token as `nats://token@host`) and of Bearer headers. The logger
// passes every line through here, and so does the one line a command dies with.

const secrets: string[] = []
const URL_CREDENTIALS = /\b([a-z][a-z0-9+.-]*:\/\/)[^\s/?#@]+@/gi
const BEARER = /\b(bearer\s+)[^\s"',;]+/gi
export const REDACTED = '[redacted]'

/** A string never to be written (the --api-key): replaced wherever it appears. */
export function addSecret(secret: string): void {
  if (secret.length > 0 && !secrets.includes(secret)) secrets.push(secret)
}

/** The text with known secrets, URL credentials and Bearer tokens replaced. */
export function redactSecrets(text: string): string {
  let out = text
  for (const s of secrets) if (out.includes(s)) out = out.split(s).join(REDACTED)
  if (out.includes('@')) out = out.replace(URL_CREDENTIALS, `$1${REDACTED}@`)
  if (out.length > 6 && /bearer/i.test(out)) out = out.replace(BEARER, `$1${REDACTED}`)
  return out
}
