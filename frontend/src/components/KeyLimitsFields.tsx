// The per-key limit inputs, shared by the key creation form and the edit dialog on the API keys page.
import { NumberInput, Select, SimpleGrid } from '@mantine/core'
import { KEY_LIMITS, draftErrors, type LimitsDraft, type PriorityClass } from './keyLimits'

/** One input per limit and the priority class. A number out of range is marked as typed (never clamped: 0 became
 *  1 on blur); `errors` are the API's, shown where the value typed is not already wrong. */
export function KeyLimitsFields({ draft, onChange, errors = {} }: {
  draft: LimitsDraft
  onChange: (next: LimitsDraft) => void
  errors?: Record<string, string>
}) {
  const typed = draftErrors(draft)
  return (
    <SimpleGrid cols={{ base: 1, sm: 2 }} spacing="xs">
      {KEY_LIMITS.map((l) => (
        <NumberInput
          key={l.key}
          label={l.label}
          description="Empty: no limit of its own"
          allowDecimal={false}
          value={draft.numbers[l.key]}
          error={typed[l.key] ?? errors[l.key]}
          onChange={(v) => onChange({ ...draft, numbers: { ...draft.numbers, [l.key]: v } })}
        />
      ))}
      <Select
        label="Priority class"
        description="Order under saturation; empty: the tenant's"
        clearable
        data={['high', 'normal', 'low']}
        value={draft.priority}
        error={errors.priority_class}
        onChange={(v) => onChange({ ...draft, priority: (v || null) as PriorityClass | null })}
        comboboxProps={{ withinPortal: true }}
      />
    </SimpleGrid>
  )
}
