import { screen } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import type { UsageSeriesRow } from '../../api/client'
import { UsageChart, pivot, usageSeries } from '../UsageChart'
import { renderWithMantine } from './render'

const row = (t: string, model: string, requests: number): UsageSeriesRow => ({
  t, model, requests, failures: 0, prompt_tokens: requests * 3, completion_tokens: requests * 5, latency_ms_avg: 12.5,
})

describe('pivot', () => {
  it('makes one point per bucket, oldest first, with a zero for models silent in it', () => {
    const rows = [row('2026-12-01T09:01:00+00:00', 'sums', 2), row('2026-12-01T09:00:00+00:00', 'capitals', 4),
      row('2026-12-01T09:01:00+00:00', 'capitals', 1)]
    const { data, models } = pivot(rows, 'completion_tokens')
    expect(models).toEqual(['capitals', 'sums'])
    expect(data).toEqual([
      { t: '09:00', capitals: 20, sums: 0 },
      { t: '09:01', capitals: 5, sums: 10 },
    ])
  })
})

describe('usageSeries', () => {
  it('names a pinned model in the legend as `name vN`, like the tables', () => {
    expect(usageSeries(['capitals', 'capitals@2']).map((s) => s.label)).toEqual(['capitals', 'capitals v2'])
    expect(usageSeries(['capitals@2'])[0].name).toBe('capitals@2') // the data key stays the model as sent
  })
})

describe('UsageChart', () => {
  it('labels the chart for screen readers and says when there is no traffic', () => {
    const { rerender } = renderWithMantine(<UsageChart rows={[row('2026-12-01T09:00:00Z', 'a', 1)]} metric="requests" label="Requests" />)
    expect(screen.getByRole('img', { name: 'Requests per model over time' })).toBeInTheDocument()
    rerender(<UsageChart rows={[]} metric="requests" label="Requests" />)
    expect(screen.getByText('No traffic in this period.')).toBeInTheDocument()
  })
})
