#!/usr/bin/env node
// `npm run docs:config`: writes the option tables of docs/configuration.md from the commands'
// tables (src/cli/configuration-doc.ts), after a build if a source changed.
import { readFileSync, writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath, pathToFileURL } from 'node:url'

const root = fileURLToPath(new URL('../', import.meta.url))
const { renderConfigurationDoc } = await import(pathToFileURL(join(root, 'dist', 'src', 'cli', 'configuration-doc.js')).href)
const path = join(root, 'docs', 'configuration.md')
const before = readFileSync(path, 'utf8')
const after = renderConfigurationDoc(before)
if (after === before) process.stdout.write('docs/configuration.md is up to date\n')
else {
  writeFileSync(path, after)
  process.stdout.write('docs/configuration.md: option tables rewritten\n')
}
