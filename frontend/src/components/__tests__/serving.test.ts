import { describe, expect, it } from 'vitest'
import { ruleText, toEntries } from '../serving'

describe('serving rule words', () => {
  it('names each version and its share, heaviest first', () => {
    expect(ruleText([{ version: 3, weight: 90 }, { version: 4, weight: 10 }])).toBe('v3 90 % · v4 10 %')
    expect(ruleText([])).toBe('nothing yet')
    expect(ruleText(null)).toBe('nothing yet')
  })
  it('reads stored rules from the audit trail', () => {
    expect(toEntries([[1, 100]])).toEqual([{ version: 1, weight: 100 }])
    expect(toEntries('junk')).toEqual([])
  })
})
