import { describe, expect, it } from 'vitest'
import type { Schemas } from '../api/client'
import { usageTotals } from '../pages/Usage'

const row = (model: string, version: number | null, requests: number): Schemas['UsageRow'] => ({
  model, adapter: version == null ? null : model, version, requests, prompt_tokens: requests * 10, completion_tokens: requests * 2,
})

describe('usageTotals', () => {
  it('names each version as `name vN` (base: `name (base)`) and counts name and name@n under one row', () => {
    const totals = usageTotals([row('capitals', 1, 4), row('capitals', 2, 1), row('capitals@1', 1, 3), row('tiny-llama', null, 5)])
    expect(totals).toEqual([
      { label: 'capitals v1', requests: 7, prompt_tokens: 70, completion_tokens: 14 },
      { label: 'capitals v2', requests: 1, prompt_tokens: 10, completion_tokens: 2 },
      { label: 'tiny-llama (base)', requests: 5, prompt_tokens: 50, completion_tokens: 10 },
    ])
  })
})
