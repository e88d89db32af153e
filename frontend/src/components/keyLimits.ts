// Per-key gateway limits on the API keys page: the form's values, the request bodies and the API's answers in words.
// The API decides who may set what (members may only tighten, a key never loosens past its own limits); the console
// sends what was asked and shows the refusal with the field named.
import type { ApiKey, Schemas } from '../api/client'

export const KEY_LIMITS = [
  { key: 'rpm_limit', label: 'Requests per minute (RPM)', short: 'RPM' },
  { key: 'tpm_limit', label: 'Tokens per minute (TPM)', short: 'TPM' },
  { key: 'concurrency_limit', label: 'Concurrent requests', short: 'concurrent' },
  { key: 'max_tokens_limit', label: 'Max tokens per request', short: 'max tokens' },
] as const
export type LimitKey = (typeof KEY_LIMITS)[number]['key']
export type PriorityClass = NonNullable<Schemas['PatchedLimits']['priority_class']>
export type Limits = Schemas['PatchedLimits']

/** The form's values: each number as typed (`''` = unlimited), and the priority class (null = the tenant's). */
export interface LimitsDraft {
  numbers: Record<LimitKey, number | string>
  priority: PriorityClass | null
}

export const FIELD_LABELS: Record<string, string> = {
  ...Object.fromEntries(KEY_LIMITS.map((l) => [l.key, l.label])),
  priority_class: 'Priority class',
}

export const emptyDraft = (): LimitsDraft => ({
  numbers: { rpm_limit: '', tpm_limit: '', concurrency_limit: '', max_tokens_limit: '' },
  priority: null,
})

/** A key's current limits as the edit form's starting values. */
export function draftOf(key: ApiKey): LimitsDraft {
  return {
    numbers: Object.fromEntries(KEY_LIMITS.map((l) => [l.key, key[l.key] ?? ''])) as Record<LimitKey, number | string>,
    priority: (key.priority_class || null) as PriorityClass | null,
  }
}

const toNumber = (v: number | string): number | null => (v === '' || v == null ? null : Number(v))

// PostgreSQL's integer, the API's ceiling (tenants/serializers.py PG_INT_MAX).
const LIMIT_MAX = 2 ** 31 - 1

/** What is wrong with the numbers typed, per field (empty: nothing): each limit set must be a whole number from 1
 *  to 2147483647. The input used to clamp 0 to 1 on blur, which made a key capped at one token instead of saying
 *  that 0 is no limit the API takes. */
export function draftErrors(draft: LimitsDraft): Record<string, string> {
  const errors: Record<string, string> = {}
  for (const l of KEY_LIMITS) {
    const v = toNumber(draft.numbers[l.key])
    if (v == null) continue
    if (!Number.isInteger(v) || v < 1) errors[l.key] = 'Use a whole number of 1 or more; leave it empty for no limit of its own.'
    else if (v > LIMIT_MAX) errors[l.key] = `At most ${LIMIT_MAX}; leave it empty for no limit of its own.`
  }
  return errors
}

/** The first of {@link draftErrors} as one line naming the field, for the form's alert; null when all is well. */
export function draftErrorText(draft: LimitsDraft): string | null {
  const [field, message] = Object.entries(draftErrors(draft))[0] ?? []
  return field ? `${FIELD_LABELS[field]}: ${message}` : null
}

/** The whole draft as limits (empty = null, unlimited). */
export function limitsOf(draft: LimitsDraft): Limits {
  const out: Limits = {}
  for (const l of KEY_LIMITS) out[l.key] = toNumber(draft.numbers[l.key])
  out.priority_class = draft.priority
  return out
}

/** The body for `POST /api/v1/api-keys`: only the limits set (none set = the key is bound by the tenant's alone). */
export function createLimits(draft: LimitsDraft): Limits {
  return Object.fromEntries(Object.entries(limitsOf(draft)).filter(([, v]) => v != null)) as Limits
}

/** The body for `PATCH /api/v1/api-keys/{key_id}`: only what differs from the key now, so a member who tightens
 *  one limit is not refused over another they left as it was. Empty when nothing changed. */
export function changedLimits(key: ApiKey, draft: LimitsDraft): Limits {
  const now = limitsOf(draftOf(key))
  const asked = limitsOf(draft)
  return Object.fromEntries(
    Object.entries(asked).filter(([k, v]) => v !== now[k as keyof Limits]),
  ) as Limits
}

/** "60 RPM · 4 concurrent · high" for the key list; "tenant's limits only" when the key sets none. */
export function limitsText(key: ApiKey): string {
  const parts: string[] = KEY_LIMITS.filter((l) => key[l.key] != null).map((l) => `${key[l.key]} ${l.short}`)
  if (key.priority_class) parts.push(`${key.priority_class} priority`)
  return parts.length ? parts.join(' · ') : "tenant's limits only"
}

/** The API's refusal (`{detail, fields?}`, thrown by `unwrap`) as one line naming the field, and per-field messages
 *  for the inputs. */
export function limitError(err: unknown): { text: string; fields: Record<string, string> } {
  const e = (err ?? {}) as { message?: string; fields?: Record<string, unknown> }
  const fields: Record<string, string> = {}
  for (const [name, value] of Object.entries(e.fields ?? {})) {
    const message = Array.isArray(value) ? String(value[0] ?? '') : String(value ?? '')
    if (message) fields[name] = message
  }
  let text = e.message || 'The API refused the limits.'
  // A 403 (`limit_owner_only`) has no `fields` but quotes the field in its message: mark that input too.
  if (Object.keys(fields).length === 0) {
    const quoted = Object.keys(FIELD_LABELS).find((name) => text.includes(`'${name}'`))
    if (quoted) fields[quoted] = text
  }
  const named = Object.keys(fields)[0]
  if (named && FIELD_LABELS[named] && !text.includes(FIELD_LABELS[named])) text = `${FIELD_LABELS[named]}: ${text}`
  return { text, fields }
}
