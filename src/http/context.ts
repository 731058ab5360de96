// What every route module is given: the router core and the parts the HTTP server made.
import type { ServeConfig } from '../config.js'
import type { Router } from '../core/router.js'
import type { TextTokenizer } from '../tokenizer/tokenizer.js'
import type { Logger } from '../runtime/log.js'
import type { UpstreamProxy } from './proxy/proxy.js'

export interface HttpContext {
  readonly router: Router
  readonly cfg: ServeConfig
  readonly tokenizer: TextTokenizer | null
  readonly proxy: UpstreamProxy
  /** The app's logger (its request lines). */
  readonly log: Logger
  /** True once the shutdown began. */
  closing(): boolean
}
