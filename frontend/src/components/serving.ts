// Words for serving rules (docs/versions.md), shared by the adapter page and its serving panel.
import type { Schemas } from '../api/client'

export type RuleEntry = Schemas['RuleEntry']

/** "v3 90 % · v4 10 %" for a rule, heaviest first as the API sends it; "nothing yet" when empty. */
export function ruleText(rule: RuleEntry[] | null | undefined): string {
  if (!rule || rule.length === 0) return 'nothing yet'
  return rule.map((e) => `v${e.version} ${e.weight} %`).join(' · ')
}

/** A stored rule from the audit trail (`[[version, weight], ...]`) as entries; anything else as none. */
export function toEntries(raw: unknown): RuleEntry[] {
  return Array.isArray(raw)
    ? raw
        .filter((e): e is [number, number] => Array.isArray(e) && e.length === 2)
        .map(([version, weight]) => ({ version, weight }))
    : []
}
