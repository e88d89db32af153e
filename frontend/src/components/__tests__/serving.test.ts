import { describe, expect, it } from 'vitest'
import { actorText, canaryBlocked, rollbackText, ruleText, toEntries, warmText } from '../serving'

describe('serving rule words', () => {
  it('names each version and its share, heaviest first', () => {
    expect(ruleText([{ version: 3, weight: 90 }, { version: 4, weight: 10 }])).toBe('v3 90 % · v4 10 %')
    expect(ruleText([])).toBe('nothing yet')
    expect(ruleText(null)).toBe('nothing yet')
  })
  it('offers no rollback when the API has no earlier rule (previous_rule: [], which a rollback answers with a 409)', () => {
    expect(rollbackText([])).toBeNull()
    expect(rollbackText(null)).toBeNull()
    expect(rollbackText([{ version: 2, weight: 100 }])).toBe('Roll back returns to v2 100 %.')
  })
  it('reads stored rules from the audit trail', () => {
    expect(toEntries([[1, 100]])).toEqual([{ version: 1, weight: 100 }])
    expect(toEntries('junk')).toEqual([])
  })
  it('offers no canary for the version serving alone or for the primary, as the API refuses both', () => {
    expect(canaryBlocked([{ version: 1, weight: 100 }], 1)).toMatch(/already takes all traffic: upload a new version/)
    const split = [{ version: 1, weight: 90 }, { version: 2, weight: 10 }]
    expect(canaryBlocked(split, 1)).toMatch(/takes 90 % now.*Promote v1.*pick v2/)
    expect(canaryBlocked(split, 2)).toBeNull()
    expect(canaryBlocked([{ version: 1, weight: 100 }], 2)).toBeNull()
    expect(canaryBlocked([{ version: 1, weight: 50 }, { version: 2, weight: 50 }], 1)).toBeNull()
    expect(canaryBlocked([], 1)).toBeNull()
  })
  it('names the key that acted by its name, and anyone else as stored', () => {
    expect(actorText({ actor: 'key:3f9a01', key_name: 'ci-bot' })).toBe('key “ci-bot” (key:3f9a01)')
    expect(actorText({ actor: 'key:3f9a01', key_name: null })).toBe('key:3f9a01') // a key no longer stored
    expect(actorText({ actor: 'alice', key_name: null })).toBe('alice')
  })
  it('says what a warm state means rather than the API code', () => {
    expect(warmText('3', 'no_node')).toMatch(/^v3 not loaded: no live node serves its base model yet.*quiver_node_wait/)
    expect(warmText(3, 'warm')).toBe('v3 loaded')
    expect(warmText(3, 'cold')).toMatch(/still loading/)
  })
})
