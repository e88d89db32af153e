import { screen, within } from '@testing-library/react'
import userEvent from '@testing-library/user-event'
import { describe, expect, it } from 'vitest'
import type { TrafficRow } from '../../api/client'
import { sparksByAdapter } from '../../pages/Adapters'
import { TrafficTable, fmtMs, sortRows } from '../TrafficTable'
import { renderWithMantine } from './render'

const row = (model: string, requests: number, p50: number | null, spark: number[] = [1, 2], version: number | null = 1): TrafficRow => ({
  tenant: 'acme', model, version, requests, requests_per_s: requests / 3600, prompt_tokens: 1, completion_tokens: 2,
  tokens_per_s: 0.5, failures: model === 'sums' ? 2 : 0, latency_ms_p50: p50, latency_ms_p95: p50 == null ? null : p50 * 2, latency_ms_p99: p50,
  ttft_ms_p50: null, ttft_ms_p95: null, spark,
})

describe('sortRows', () => {
  it('sorts numbers descending or ascending with nulls last, names alphabetically', () => {
    const rows = [row('b', 5, 30), row('a', 9, null), row('c', 1, 10)]
    expect(sortRows(rows, 'latency_ms_p50', true).map((r) => r.model)).toEqual(['b', 'c', 'a'])
    expect(sortRows(rows, 'latency_ms_p50', false).map((r) => r.model)).toEqual(['c', 'b', 'a'])
    expect(sortRows(rows, 'model', false).map((r) => r.model)).toEqual(['a', 'b', 'c'])
    expect(fmtMs(null)).toBe('—')
    expect(fmtMs(3.14159)).toBe('3.1')
    expect(fmtMs(250.6)).toBe('251')
  })
})

describe('TrafficTable', () => {
  it('shows one row per adapter with a sparkline, most requests first, and re-sorts on a header click', async () => {
    renderWithMantine(<TrafficTable rows={[row('capitals', 3, 40, [0, 1, 2]), row('sums', 7, 12.5, [7])]} />)
    const table = screen.getByRole('table', { name: 'Traffic per adapter' })
    const rows = within(table).getAllByRole('row').slice(1)
    expect(rows.map((r) => r.textContent?.split(' ')[0])).toEqual(['sums', 'capitals'])
    expect(screen.getByRole('img', { name: 'Requests of capitals v1 over time: 3 requests' })).toBeInTheDocument()
    expect(within(rows[0]).getByText('13')).toBeInTheDocument() // p50 12.5 ms rounds to 13
    await userEvent.click(screen.getByRole('button', { name: /^p50 ms/ }))
    const header = screen.getByRole('columnheader', { name: /^p50 ms/ })
    expect(header).toHaveAttribute('aria-sort', 'descending')
    expect(within(table).getAllByRole('row')[1]).toHaveTextContent('capitals')
    await userEvent.click(screen.getByRole('button', { name: /^p50 ms/ }))
    expect(header).toHaveAttribute('aria-sort', 'ascending')
  })

  it('explains an empty TTFT: streamed requests only, and "—" when none came in the period', () => {
    const streamed = { ...row('capitals', 3, 40), ttft_ms_p50: 21.4 }
    const { rerender } = renderWithMantine(<TrafficTable rows={[streamed, row('sums', 7, 12.5)]} />)
    expect(screen.getByRole('button', { name: /^TTFT p50 ms/ })).toHaveAttribute('title', expect.stringMatching(/streamed requests only/))
    const dash = within(screen.getByTestId('traffic-acme-sums')).getByText('—')
    expect(dash).toHaveAttribute('title', 'No streamed request in this period: TTFT is measured on streamed requests only.')
    expect(within(screen.getByTestId('traffic-acme-capitals')).getByText('21')).not.toHaveAttribute('title')
    expect(screen.getByText(/— means no streamed request in this period/)).toBeInTheDocument() // also on touch screens
    rerender(<TrafficTable rows={[streamed]} />)
    expect(screen.queryByText(/— means no streamed request/)).toBeNull()
  })

  it('writes a low token rate with its unit, never 0.0 (issue 30)', () => {
    renderWithMantine(<TrafficTable rows={[{ ...row('capitals', 1, 40), tokens_per_s: 0.004 }, { ...row('sums', 9, 10), tokens_per_s: 12.3 }]} />)
    expect(screen.getByRole('columnheader', { name: /^Token rate/ })).toBeInTheDocument()
    expect(within(screen.getByTestId('traffic-acme-capitals')).getByText('14/h')).toBeInTheDocument()
    expect(within(screen.getByTestId('traffic-acme-sums')).getByText('12/s')).toBeInTheDocument()
  })

  it('names versions as everywhere else: `name vN`, also for name@n, and `name (base)`', () => {
    renderWithMantine(<TrafficTable rows={[row('capitals@2', 3, 40, [1], 2), row('tiny-llama', 1, 20, [1], null)]} />)
    expect(within(screen.getByTestId('traffic-acme-capitals@2')).getByText('capitals v2')).toBeInTheDocument()
    expect(within(screen.getByTestId('traffic-acme-tiny-llama')).getByText('tiny-llama (base)')).toBeInTheDocument()
  })

  it('says when there is no traffic', () => {
    renderWithMantine(<TrafficTable rows={[]} />)
    expect(screen.getByText('No traffic in this period.')).toBeInTheDocument()
  })
})

describe('sparksByAdapter', () => {
  it('sums versions and name@n requests per adapter and leaves out the base model', () => {
    const sparks = sparksByAdapter([row('capitals', 1, 1, [1, 0]), row('capitals@2', 1, 1, [0, 3], 2), row('tiny-llama', 9, 1, [9, 9], null)])
    expect(Object.fromEntries(sparks)).toEqual({ capitals: [1, 3] })
  })
})
