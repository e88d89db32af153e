import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { act, screen, within } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { api, type Node } from '../api/client'
import { renderWithMantine } from '../components/__tests__/render'
import { pageCount, pageQuery } from '../components/paging'
import { NODES_PAGE, Nodes } from '../pages/Nodes'
import { capacityRows, slotFigures } from '../pages/nodeFigures'

describe('slotFigures', () => {
  it('labels capacity by the engine setting, never as GPU (the node API reports no device, and CPU nodes have slots too)', () => {
    const cpuNode = { gpu_used: 2, max_loras: 2, cpu_used: 3, max_cpu_loras: 4 } as Node
    expect(slotFigures(cpuNode)).toEqual([
      { label: 'LoRA slots (max_loras)', value: '2/2' },
      // vLLM's CPU cache holds the slot residents too, and cpu_used counts them: said, and split (issue 30)
      { label: 'CPU cache, LoRA slots included (max_cpu_loras)', value: '3/4', note: '2 in LoRA slots + 1 in the CPU cache only' },
    ])
  })
})

describe('capacityRows', () => {
  it("shows the node's reported capacity beside its ceilings, and which one is in force", () => {
    const n = {
      max_loras: 8, max_cpu_loras: 16, max_lora_rank: 0,
      reported: { max_loras: 12, max_cpu_loras: 16, max_lora_rank: null },
      ceilings: { max_loras: 8, max_cpu_loras: 32, max_lora_rank: 16 },
    } as unknown as Node
    expect(capacityRows(n)).toEqual([
      { label: 'LoRA slots', reported: 12, ceiling: 8, inForce: 8, source: 'ceiling, report clamped' },
      { label: 'CPU cache', reported: 16, ceiling: 32, inForce: 16, source: 'reported' },
      // not reported: 0 in force whatever the ceiling (the control plane counts it as 0 until a heartbeat says)
      { label: 'LoRA rank', reported: null, ceiling: 16, inForce: 0, source: 'nothing reported' },
    ])
    const equal = { ...n, max_loras: 8, reported: { ...n.reported, max_loras: 8 } } as Node
    expect(capacityRows(equal)[0].source).toBe('reported = ceiling')
  })
})

describe('paging', () => {
  it('asks for 1-based pages as limit/offset and counts pages, an empty list being one page', () => {
    expect(pageQuery(1, 12)).toEqual({ limit: 12, offset: 0 })
    expect(pageQuery(3, 12)).toEqual({ limit: 12, offset: 24 })
    expect([pageCount(0, 12), pageCount(12, 12), pageCount(13, 12), pageCount(64, 12)]).toEqual([1, 1, 2, 6])
  })
})

const node = (i: number): Node => ({
  name: `gpu-${String(i).padStart(2, '0')}`, base_model: 'm', healthy: true, last_heartbeat_at: null, max_loras: 4,
  max_cpu_loras: 8, max_lora_rank: 16, kv_cache_usage_perc: 0.1, num_requests_running: 0, num_requests_waiting: 0,
  num_preemptions_total: null, gpu_used: 1, cpu_used: 2, failed_requests_5m: 0,
  tiers: { hot: 1, warm: 2, staged: 0, cold: 3, errored: 0 }, pinned: i % 2,
  reported: { max_loras: 4, max_cpu_loras: 8, max_lora_rank: 16 },
  ceilings: { max_loras: 8, max_cpu_loras: 32, max_lora_rank: 16 },
})
const FLEET = Array.from({ length: 30 }, (_, i) => node(i))

/** `api.GET` answering the nodes list from `fleet()` as the API pages it (`limit`, `offset`), `[]` for the rest. */
const serve = (fleet: () => Node[]) =>
  vi.spyOn(api, 'GET').mockImplementation((async (path: string, init?: { params?: { query?: { limit?: number; offset?: number } } }) => {
    if (path !== '/api/v1/operator/nodes') return { data: [], error: undefined, response: new Response('[]') }
    const { limit = 50, offset = 0 } = init?.params?.query ?? {}
    return { data: { count: fleet().length, next: null, previous: null, results: fleet().slice(offset, offset + limit) }, error: undefined, response: new Response('{}') }
  }) as never)

describe('Fleet page', () => {
  afterEach(() => vi.restoreAllMocks())

  it('shows one page of nodes with their placements per tier and pages through the rest', async () => {
    const get = serve(() => FLEET)
    const qc = new QueryClient({ defaultOptions: { queries: { retry: false } } })
    renderWithMantine(<QueryClientProvider client={qc}><Nodes /></QueryClientProvider>)
    expect(await screen.findByLabelText('Node gpu-00')).toBeInTheDocument()
    expect(screen.getAllByLabelText(/^Node gpu-/)).toHaveLength(NODES_PAGE)
    expect(screen.queryByLabelText('Node gpu-12')).toBeNull()
    expect(screen.getByText(`1–${NODES_PAGE} of 30`)).toBeInTheDocument()
    const placed = within(screen.getByLabelText('Placements on gpu-01'))
    expect(placed.getAllByText(/./).map((b) => b.textContent)).toEqual(['1 LoRA slot', '2 CPU cache', '3 cold', '1 pinned'])
    const capacity = within(screen.getByLabelText('Capacity of gpu-01'))
    // fixture: reported 4 slots under a ceiling of 8, so the report is in force
    expect(capacity.getByRole('row', { name: /LoRA slots/ }).textContent).toBe('LoRA slots484 (reported)')
    expect(get).toHaveBeenCalledWith('/api/v1/operator/nodes', { params: { query: { limit: NODES_PAGE, offset: 0 } } })

    await userEvent.click(within(screen.getByLabelText('Pages of nodes')).getByRole('button', { name: '3' }))
    expect(await screen.findByLabelText('Node gpu-24')).toBeInTheDocument()
    expect(screen.getAllByLabelText(/^Node gpu-/)).toHaveLength(30 - 2 * NODES_PAGE)
    expect(screen.getByText('25–30 of 30')).toBeInTheDocument()
    expect(get).toHaveBeenCalledWith('/api/v1/operator/nodes', { params: { query: { limit: NODES_PAGE, offset: 2 * NODES_PAGE } } })
  })

  it('steps back to the last page when the fleet shrank under the one shown', async () => {
    let fleet = FLEET
    serve(() => fleet)
    const qc = new QueryClient({ defaultOptions: { queries: { retry: false } } })
    renderWithMantine(<QueryClientProvider client={qc}><Nodes /></QueryClientProvider>)
    await userEvent.click(within(await screen.findByLabelText('Pages of nodes')).getByRole('button', { name: '3' }))
    expect(await screen.findByLabelText('Node gpu-24')).toBeInTheDocument()
    fleet = FLEET.slice(0, NODES_PAGE + 1) // 13 nodes: two pages now
    await act(() => qc.invalidateQueries({ queryKey: ['operator-nodes'] }))
    expect(await screen.findByText(`${NODES_PAGE + 1}–${NODES_PAGE + 1} of ${NODES_PAGE + 1}`)).toBeInTheDocument()
    expect((await screen.findAllByLabelText(/^Node gpu-/)).map((c) => c.getAttribute('aria-label'))).toEqual([`Node gpu-${NODES_PAGE}`])
  })
})
