// The repository's root, found from this file wherever it runs: the suite runs compiled, from
// dist/test/, and a path relative to a test file would point into dist/.
import { existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

function findRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url))
  while (!existsSync(join(dir, 'package.json'))) {
    const up = dirname(dir)
    if (up === dir) throw new Error(`no package.json above ${fileURLToPath(import.meta.url)}`)
    dir = up
  }
  return dir
}

/** The repository's root directory (where package.json is), without a trailing separator. */
export const repoRoot = findRoot()

/** A path under the repository's root. */
export const fromRoot = (...parts: string[]): string => join(repoRoot, ...parts)

/** The root as a directory URL, for `new URL(relative, rootUrl)`. */
export const rootUrl: URL = pathToFileURL(`${repoRoot}/`)
