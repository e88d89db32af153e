import { QueryClient, QueryClientProvider } from '@tanstack/react-query'
import { screen, within } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { api, type TrafficRow } from '../api/client'
import { renderWithMantine } from '../components/__tests__/render'
import { TRAFFIC_PAGE, Traffic } from '../pages/Traffic'

const row = (i: number): TrafficRow => ({
  tenant: `t-${i % 3}`, model: `a${String(i).padStart(3, '0')}`, version: 1, requests: 1000 - i, requests_per_s: 0.1,
  prompt_tokens: 1, completion_tokens: 1, tokens_per_s: 0.01, failures: 0, latency_ms_p50: 10, latency_ms_p95: 20,
  latency_ms_p99: 30, ttft_ms_p50: null, ttft_ms_p95: null, spark: [1],
})
const TABLE = Array.from({ length: 120 }, (_, i) => row(i))
type Query = { limit?: number; offset?: number; ordering?: string }

/** `api.GET` answering the operator traffic table as the API pages it (`limit`, `offset`; this fake ignores
 * `ordering`), `[]` for the rest; `hold(offset)` keeps that page's answer back until the returned release is called. */
function serve() {
  const held = new Map<number, () => void>()
  const holds = new Set<number>()
  const get = vi.spyOn(api, 'GET').mockImplementation((async (path: string, init?: { params?: { query?: Query } }) => {
    if (path !== '/api/v1/operator/traffic') return { data: [], error: undefined, response: new Response('[]') }
    const { limit = 50, offset = 0 } = init?.params?.query ?? {}
    if (holds.has(offset)) await new Promise<void>((resolve) => held.set(offset, resolve))
    return { data: { count: TABLE.length, next: null, previous: null, results: TABLE.slice(offset, offset + limit) }, error: undefined, response: new Response('{}') }
  }) as never)
  return { get, hold: (offset: number) => holds.add(offset), release: (offset: number) => held.get(offset)?.() }
}

const render = () => {
  const qc = new QueryClient({ defaultOptions: { queries: { retry: false } } })
  renderWithMantine(<QueryClientProvider client={qc}><Traffic /></QueryClientProvider>)
}
const shown = () => within(screen.getByRole('table', { name: 'Traffic per adapter' })).getAllByRole('row').slice(1)
const lastQuery = (get: ReturnType<typeof serve>['get']) => (get.mock.calls.filter((c) => c[0] === '/api/v1/operator/traffic').at(-1)?.[1] as { params: { query: Query } }).params.query

describe('Traffic page (operators)', () => {
  afterEach(() => vi.restoreAllMocks())

  it('shows a page of versions in the order the API gave, keeps it up while the next page loads', async () => {
    const { get, hold, release } = serve()
    render()
    expect(await screen.findByTestId('traffic-t-0-a000')).toBeInTheDocument()
    expect(shown()).toHaveLength(TRAFFIC_PAGE)
    expect(screen.getByText(`1–${TRAFFIC_PAGE} of 120`)).toBeInTheDocument()
    expect(lastQuery(get)).toMatchObject({ limit: TRAFFIC_PAGE, offset: 0, ordering: '-requests' })

    hold(2 * TRAFFIC_PAGE)
    await userEvent.click(within(screen.getByLabelText('Pages of adapter versions')).getByRole('button', { name: '3' }))
    expect(lastQuery(get)).toMatchObject({ offset: 2 * TRAFFIC_PAGE })
    expect(screen.getByTestId('traffic-t-0-a000')).toBeInTheDocument() // the old page stays up meanwhile
    release(2 * TRAFFIC_PAGE)
    expect(await screen.findByTestId('traffic-t-2-a110')).toBeInTheDocument()
    expect(shown()).toHaveLength(120 - 2 * TRAFFIC_PAGE)
    expect(screen.queryByTestId('traffic-t-0-a000')).toBeNull()
  })

  it('asks the API for another order from the first page; percentile columns are not sortable', async () => {
    const { get } = serve()
    render()
    await userEvent.click(within(await screen.findByLabelText('Pages of adapter versions')).getByRole('button', { name: '2' }))
    expect(await screen.findByTestId('traffic-t-2-a050')).toBeInTheDocument()
    await userEvent.click(screen.getByRole('button', { name: /^Requests/ }))
    expect(lastQuery(get)).toMatchObject({ offset: 0, ordering: 'requests' })
    expect(await screen.findByRole('columnheader', { name: /^Requests/ })).toHaveAttribute('aria-sort', 'ascending')
    await userEvent.click(screen.getByRole('button', { name: /^Tenant/ }))
    expect(lastQuery(get)).toMatchObject({ offset: 0, ordering: 'tenant' })
    expect(screen.queryByRole('button', { name: /^p50 ms/ })).toBeNull()
    expect(screen.getByRole('columnheader', { name: /^p50 ms/ })).toHaveAttribute('title', expect.stringMatching(/this page only/))
    // The rows are shown as the API ordered them, not re-sorted here.
    expect(shown()[0]).toHaveTextContent('a000')
  })
})
