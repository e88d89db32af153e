import { screen, within } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import type { Placement, ResidencyRow } from '../../api/client'
import { Residency } from '../../pages/Adapters'
import { ResidencyMap } from '../ResidencyMap'
import { TIERS, TIER_COLOR, TIER_HELP, TIER_LABEL, TierBadge, tierCounts, tierLabel } from '../tiers'
import { renderWithMantine } from './render'

describe('tier vocabulary', () => {
  it('names every API tier once: hot LoRA slot, warm CPU cache, staged disk, cold cold', () => {
    expect(TIERS.map(tierLabel)).toEqual(['LoRA slot', 'CPU cache', 'disk', 'cold', 'errored'])
    expect(tierLabel('someday')).toBe('someday')
  })

  it('names the engine places, never a device: a CPU-only node has LoRA slots too', () => {
    for (const tier of TIERS) expect(tierLabel(tier)).not.toMatch(/\bGPU\b/)
    expect(TIER_HELP.hot).toContain('max_loras')
    expect(TIER_HELP.warm).toContain('max_cpu_loras')
  })

  it('colours the best tier as good news and keeps the warning colours for the failed one', () => {
    expect(TIER_COLOR.hot).toBe('green')
    expect(TIER_COLOR.errored).toBe('red')
    for (const tier of TIERS.filter((t) => t !== 'errored')) expect(['red', 'orange', 'yellow']).not.toContain(TIER_COLOR[tier])
    renderWithMantine(<TierBadge tier="hot" count={1} />)
    const badge = screen.getByText('1 LoRA slot').closest('.mantine-Badge-root') as HTMLElement
    expect(badge.style.getPropertyValue('--badge-color')).toContain('green')
  })

  it('orders counts closest-to-serving first and drops empty tiers', () => {
    expect(tierCounts({ staged: 2, cold: 0, hot: 1, warm: 3 })).toEqual([
      { tier: 'hot', label: 'LoRA slot', count: 1 },
      { tier: 'warm', label: 'CPU cache', count: 3 },
      { tier: 'staged', label: 'disk', count: 2 },
    ])
  })

  it('the adapter list and the operator map say the same words, never the API values', () => {
    renderWithMantine(<Residency residency={{ staged: 2, hot: 1 }} />)
    const list = screen.getByLabelText('Replicas per tier')
    expect(within(list).getAllByText(/./).map((b) => b.textContent)).toEqual(['1 LoRA slot', '2 disk'])
    const cell = (node: string, tier: Placement['tier']): Placement => ({
      id: 1, node, tier, pinned: false, served: false, load_ms: null, last_error: '', updated_at: '2026-12-01T09:00:00Z',
    })
    const row: ResidencyRow = { version_id: 1, tenant: 'acme', adapter: 'x', version: 1, size_bytes: 1024, placements: [cell('n1', 'hot'), cell('n2', 'staged')] }
    renderWithMantine(<ResidencyMap versions={[row]} tenant={null} onAction={() => {}} />)
    expect(screen.getByRole('cell', { name: 'acme/x v1 on n1: LoRA slot' })).toHaveTextContent(TIER_LABEL.hot)
    expect(screen.getByRole('cell', { name: 'acme/x v1 on n2: disk' })).toHaveTextContent(TIER_LABEL.staged)
    for (const apiWord of ['hot', 'warm', 'staged']) expect(screen.queryByText(new RegExp(`\\b${apiWord}\\b`))).toBeNull()
  })
})
