// Words for serving rules (docs/versions.md), shared by the adapter page and its serving panel.
import type { Schemas } from '../api/client'

export type RuleEntry = Schemas['RuleEntry']

/** "v3 90 % · v4 10 %" for a rule, heaviest first as the API sends it; "nothing yet" when empty. */
export function ruleText(rule: RuleEntry[] | null | undefined): string {
  if (!rule || rule.length === 0) return 'nothing yet'
  return rule.map((e) => `v${e.version} ${e.weight} %`).join(' · ')
}

/** What Roll back would do, or null when there is no earlier rule: the API answers `previous_rule: []` for an adapter
 * whose first version serves alone, and a rollback then is a 409 `nothing_to_roll_back`, so the panel disables the
 * button and says why instead of offering one that fails. */
export function rollbackText(previous: RuleEntry[] | null | undefined): string | null {
  if (!previous || previous.length === 0) return null
  return `Roll back returns to ${ruleText(previous)}.`
}

/** A stored rule from the audit trail (`[[version, weight], ...]`) as entries; anything else as none. */
export function toEntries(raw: unknown): RuleEntry[] {
  return Array.isArray(raw)
    ? raw
        .filter((e): e is [number, number] => Array.isArray(e) && e.length === 2)
        .map(([version, weight]) => ({ version, weight }))
    : []
}

/**
 * Why a canary of `version` makes no sense under `rule`, in the API's words (inference/policy/versions.py
 * `canary_rule`), or null when it does. A canary gives a small share to a version beside the primary: the version
 * that serves alone has nothing to canary against, and a canary of the heaviest version would shrink the primary
 * (the API refuses both with a 400; the panel offers neither, rather than a button that fails).
 */
export function canaryBlocked(rule: RuleEntry[], version: number | null): string | null {
  if (version == null || rule.length === 0) return null
  const share = rule.find((e) => e.version === version)?.weight ?? 0
  const others = rule.filter((e) => e.version !== version)
  if (others.length === 0)
    return `v${version} already takes all traffic: upload a new version (or pick another ready one) to canary it.`
  const heaviest = others.reduce((a, b) => (b.weight > a.weight ? b : a))
  if (share > heaviest.weight)
    return `v${version} takes ${share} % now, the largest share: a canary never shrinks the primary. Promote v${version} to send it all traffic, or pick v${heaviest.version} to change the canary.`
  return null
}

/** Why promoting `version` would change nothing under `rule`, or null when it would: a version that already takes
 * 100 % is served alone, and a promote of it only asked for a confirmation to do nothing. */
export function promoteBlocked(rule: RuleEntry[], version: number | null): string | null {
  if (version == null) return null
  const entry = rule.find((e) => e.version === version)
  return entry && entry.weight >= 100 && rule.length === 1 ? `v${version} already takes all traffic.` : null
}

/** How many serving changes the panel lists before "Show all". */
export const CHANGES_SHOWN = 5
/** How many changes the API sends at most, newest first (adapters_app/selectors.py `serving_state`'s `history`). */
export const CHANGES_SENT_MAX = 20

/** The count beside "Changes": how many are listed out of how many the API sent, never implying the list is
 * complete when the API may have left older ones out (it sends the latest {@link CHANGES_SENT_MAX}). */
export function changesCount(sent: number, showingAll: boolean): string {
  const total = sent >= CHANGES_SENT_MAX ? `the latest ${sent}` : `${sent}`
  return sent > CHANGES_SHOWN && !showingAll ? `latest ${CHANGES_SHOWN} of ${total}` : sent >= CHANGES_SENT_MAX ? `${total}; older ones are not listed` : `${sent} in all`
}

/** Who made an audited change, as people know them: a key by its name (`key “ci-bot” (key:3f9a…)`), a user by
 * username, `system` as is. The API stores `key:<key_id>` and adds `key_name` when the key is still there. */
export function actorText(change: { actor: string; key_name?: string | null }): string {
  return change.key_name ? `key “${change.key_name}” (${change.actor})` : change.actor
}

/** A joining version's warm state after a change (`warm`, `cold`, `no_node`: adapters_app/serving.py) in words. */
export function warmText(version: string | number, state: string): string {
  if (state === 'warm') return `v${version} loaded`
  if (state === 'cold') return `v${version} still loading (its first requests wait for it)`
  if (state === 'no_node')
    return `v${version} not loaded: no live node serves its base model yet (start one, or wait: manage.py quiver_node_wait <node>)`
  return `v${version} ${state}`
}
