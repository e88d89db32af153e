import { screen } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { describe, expect, it, vi } from 'vitest'
import type { Node, Placement } from '../../api/client'
import { ResidencyMap, actionsFor, buildMap } from '../ResidencyMap'
import { renderWithMantine } from './render'

let nextId = 1
const placement = (tenant: string, adapter: string, versionId: number, tier: string, pinned = false): Placement => ({
  id: nextId++, version_id: versionId, tenant, adapter, version: 1, size_bytes: 2 * 1024 * 1024, tier: tier as Placement['tier'],
  pinned, served: tier === 'hot' || tier === 'warm', load_ms: 20, last_error: '', updated_at: '2026-12-01T09:00:00Z',
})
const node = (name: string, placements: Placement[]): Node => ({
  name, base_model: 'tiny-llama', healthy: true, last_heartbeat_at: null, max_loras: 4, max_cpu_loras: 8, max_lora_rank: 16,
  kv_cache_usage_perc: 0.1, num_requests_running: 0, num_requests_waiting: 0, num_preemptions_total: null, gpu_used: 1,
  cpu_used: 1, failed_requests_5m: 0, placements,
})

const fleet = () => [
  node('gpu-2', [placement('acme', 'capitals', 10, 'warm'), placement('beta', 'bot', 20, 'staged')]),
  node('gpu-1', [placement('acme', 'capitals', 10, 'hot', true)]),
]

describe('buildMap', () => {
  it('makes one row per version with a cell per node holding it, and filters by tenant', () => {
    const map = buildMap(fleet(), null)
    expect(map.nodes).toEqual(['gpu-1', 'gpu-2'])
    expect(map.rows.map((r) => [r.label, Object.keys(r.cells).sort()])).toEqual([
      ['acme/capitals v1', ['gpu-1', 'gpu-2']],
      ['beta/bot v1', ['gpu-2']],
    ])
    expect(buildMap(fleet(), 'beta').rows.map((r) => r.label)).toEqual(['beta/bot v1'])
  })

  it('offers unpin on pins, pin and evict in the engine, only pin on disk', () => {
    expect(actionsFor(placement('a', 'x', 1, 'hot', true))).toEqual(['unpin'])
    expect(actionsFor(placement('a', 'x', 1, 'warm'))).toEqual(['pin', 'evict'])
    expect(actionsFor(placement('a', 'x', 1, 'staged'))).toEqual(['pin'])
  })
})

describe('ResidencyMap', () => {
  it('labels every cell with its tier and pin, and hands the chosen action up', async () => {
    const onAction = vi.fn()
    renderWithMantine(<ResidencyMap nodes={fleet()} tenant={null} onAction={onAction} />)
    expect(screen.getByRole('cell', { name: 'acme/capitals v1 on gpu-1: LoRA slot, pinned' })).toHaveTextContent('2.0 MiB')
    expect(screen.getByRole('cell', { name: 'acme/capitals v1 on gpu-2: CPU cache' })).toBeInTheDocument()
    expect(screen.getByRole('cell', { name: 'beta/bot v1 on gpu-1: not placed' })).toBeInTheDocument()
    expect(screen.queryByRole('button', { name: 'evict acme/capitals v1 on gpu-1' })).toBeNull()
    await userEvent.click(screen.getByRole('button', { name: 'evict acme/capitals v1 on gpu-2' }))
    expect(onAction).toHaveBeenCalledWith(expect.objectContaining({ kind: 'evict', node: 'gpu-2', versionId: 10, label: 'acme/capitals v1' }))
  })

  it('says when nothing is placed for the chosen tenant', () => {
    renderWithMantine(<ResidencyMap nodes={fleet()} tenant="gamma" onAction={() => {}} />)
    expect(screen.getByText('No adapter version is placed on any node for gamma.')).toBeInTheDocument()
  })
})
