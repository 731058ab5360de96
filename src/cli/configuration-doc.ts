// docs/configuration.md's option tables, one per command, rendered from the commands' own tables:
// `npm run docs:config` writes them into the document, and a test holds the committed document
// equal to its rendering, so a flag added, renamed or dropped cannot leave the document behind.
import { SERVE_TABLE } from '../config.js'
import { docsTable } from '../config/table.js'
import type { CommandTable } from '../config/table.js'
import { MOCKER_TABLE } from '../sim/mocker/main.js'
import { REPLAY_TABLE } from '../sim/replay/main.js'
import { INDEXER_TABLE } from '../indexer/main.js'
import { CLUSTER_TABLE } from './cluster-options.js'

/** Each command's table, under the `## name` heading of its section. */
export const DOCUMENTED: readonly CommandTable[] = [SERVE_TABLE, MOCKER_TABLE, REPLAY_TABLE, INDEXER_TABLE, CLUSTER_TABLE]

/**
 * The document with the option table of each command's section replaced by its rendering: the
 * first table under `## command`, from its `| flag |` header to the first line that is no row.
 */
export function renderConfigurationDoc(doc: string): string {
  let out = doc
  for (const table of DOCUMENTED) {
    const heading = out.indexOf(`\n## ${table.command}\n`)
    if (heading < 0) throw new Error(`docs/configuration.md has no section "## ${table.command}"`)
    const start = out.indexOf('\n| flag |', heading)
    const next = out.indexOf('\n## ', heading + 1)
    if (start < 0 || (next >= 0 && start > next)) throw new Error(`docs/configuration.md: section "${table.command}" has no option table`)
    let end = start + 1
    while (end < out.length && out[end] === '|') end = out.indexOf('\n', end) + 1
    out = out.slice(0, start + 1) + docsTable(table) + out.slice(end)
  }
  return out
}
