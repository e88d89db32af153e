import { describe, expect, it } from 'vitest'
import { auditJson } from '../pages/Audit'

describe('auditJson', () => {
  it('names tiers in the console words, as every other page does (a fresh operator saw "warm" → "staged")', () => {
    expect(auditJson({ node: 'cpu-node-1', tier: 'warm' })).toBe('{"node":"cpu-node-1","tier":"CPU cache"}')
    expect(auditJson({ tier: 'staged', served: false })).toBe('{"tier":"disk","served":false}')
    expect(auditJson(null)).toBe('null')
  })
})
