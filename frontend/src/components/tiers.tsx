// Residency tiers: the one place the console names them. The API and the database keep their words (hot, warm,
// staged, cold, errored: docs/console.md and the conventions' vocabulary); people see where the adapter is.
// The labels name the engine's places, not a device: a CPU-only node has `max_loras` slots too, so "GPU" would be
// wrong there (vLLM's terms: a LoRA slot is one of `max_loras`, the CPU cache holds `max_cpu_loras`).
import { Badge } from '@mantine/core'

/** API tier values, in display order (closest to serving first). */
export const TIERS = ['hot', 'warm', 'staged', 'cold', 'errored'] as const

export const TIER_LABEL: Record<string, string> = { hot: 'LoRA slot', warm: 'CPU cache', staged: 'disk', cold: 'cold', errored: 'errored' }
// Closest to serving is the console's "good" colour (as ready versions and healthy nodes), fading to gray; red is
// for the one state that is a failure (the best tier was red, and read as an alarm).
export const TIER_COLOR: Record<string, string> = { hot: 'green', warm: 'teal', staged: 'blue', cold: 'gray', errored: 'red' }
export const TIER_HELP: Record<string, string> = {
  hot: 'in one of the engine’s LoRA slots (vLLM max_loras; GPU memory on a GPU node): serves now',
  warm: 'in the engine’s CPU LoRA cache (vLLM max_cpu_loras): moved to a LoRA slot on its next request',
  staged: 'on the node’s disk: loaded on first request',
  cold: 'only in object storage',
  errored: 'the engine failed to load it',
}

/** The console's word for an API tier value (an unknown value is shown as it is). */
export const tierLabel = (tier: string): string => TIER_LABEL[tier] ?? tier

/** `{"staged": 2, "hot": 1}` → `[{tier: 'hot', label: 'LoRA slot', count: 1}, {tier: 'staged', label: 'disk', count: 2}]`:
 * known tiers in display order, unknown ones after them; zero counts dropped. */
export function tierCounts(residency: Record<string, number>): { tier: string; label: string; count: number }[] {
  const rank = (t: string) => {
    const i = (TIERS as readonly string[]).indexOf(t)
    return i === -1 ? TIERS.length : i
  }
  return Object.entries(residency)
    .filter(([, count]) => count > 0)
    .sort(([a], [b]) => rank(a) - rank(b) || a.localeCompare(b))
    .map(([tier, count]) => ({ tier, label: tierLabel(tier), count }))
}

/** A tier as a badge, spelled as in TIER_LABEL (Mantine badges upper-case by default: "DISK" next to "LoRA slot"). */
export function TierBadge({ tier, count }: { tier: string; count?: number }) {
  return (
    <Badge color={TIER_COLOR[tier] ?? 'gray'} variant="light" tt="none" title={TIER_HELP[tier]}>
      {count != null ? `${count} ${tierLabel(tier)}` : tierLabel(tier)}
    </Badge>
  )
}
