import { screen } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { describe, expect, it, vi } from 'vitest'
import type { Placement, ResidencyRow } from '../../api/client'
import { ResidencyMap, actionsFor, buildMap } from '../ResidencyMap'
import { renderWithMantine } from './render'

let nextId = 1
const cell = (node: string, tier: string, pinned = false): Placement => ({
  id: nextId++, node, tier: tier as Placement['tier'], pinned, served: tier === 'hot' || tier === 'warm', load_ms: 20,
  last_error: '', updated_at: '2026-12-01T09:00:00Z',
})
const version = (tenant: string, adapter: string, versionId: number, placements: Placement[]): ResidencyRow => ({
  version_id: versionId, tenant, adapter, version: 1, size_bytes: 2 * 1024 * 1024, placements,
})

// One page of GET /api/v1/operator/residency, in its order (tenant, adapter, newest version first).
const page = () => [
  version('acme', 'capitals', 10, [cell('gpu-1', 'hot', true), cell('gpu-2', 'warm')]),
  version('beta', 'bot', 20, [cell('gpu-2', 'staged')]),
]

describe('buildMap', () => {
  it('makes one row per version with a cell per node holding it; the columns are the page’s nodes', () => {
    const map = buildMap(page())
    expect(map.nodes).toEqual(['gpu-1', 'gpu-2'])
    expect(map.rows.map((r) => [r.label, Object.keys(r.cells).sort(), r.sizeBytes])).toEqual([
      ['acme/capitals v1', ['gpu-1', 'gpu-2'], 2 * 1024 * 1024],
      ['beta/bot v1', ['gpu-2'], 2 * 1024 * 1024],
    ])
    expect(buildMap([version('beta', 'bot', 20, [cell('gpu-9', 'cold')])]).nodes).toEqual(['gpu-9'])
  })

  it('offers unpin on pins, pin and evict in the engine, only pin on disk', () => {
    expect(actionsFor(cell('x', 'hot', true))).toEqual(['unpin'])
    expect(actionsFor(cell('x', 'warm'))).toEqual(['pin', 'evict'])
    expect(actionsFor(cell('x', 'staged'))).toEqual(['pin'])
  })
})

describe('ResidencyMap', () => {
  it('labels every cell with its tier and pin, and hands the chosen action up', async () => {
    const onAction = vi.fn()
    renderWithMantine(<ResidencyMap versions={page()} tenant={null} onAction={onAction} />)
    expect(screen.getByRole('cell', { name: 'acme/capitals v1 on gpu-1: LoRA slot, pinned' })).toHaveTextContent('2.0 MiB')
    expect(screen.getByRole('cell', { name: 'acme/capitals v1 on gpu-2: CPU cache' })).toBeInTheDocument()
    expect(screen.getByRole('cell', { name: 'beta/bot v1 on gpu-1: not placed' })).toBeInTheDocument()
    expect(screen.queryByRole('button', { name: 'evict acme/capitals v1 on gpu-1' })).toBeNull()
    await userEvent.click(screen.getByRole('button', { name: 'evict acme/capitals v1 on gpu-2' }))
    expect(onAction).toHaveBeenCalledWith(expect.objectContaining({ kind: 'evict', node: 'gpu-2', versionId: 10, label: 'acme/capitals v1' }))
  })

  it('says when nothing is placed for the chosen tenant', () => {
    renderWithMantine(<ResidencyMap versions={[]} tenant="gamma" onAction={() => {}} />)
    expect(screen.getByText('No adapter version is placed on any node for gamma.')).toBeInTheDocument()
  })
})
