import { screen } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import type { UsageSeriesRow } from '../../api/client'
import { UsageChart } from '../UsageChart'
import { OTHER, PALETTE, groupModels, pivot, usageSeries } from '../usageSeries'
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
  it('names each line as the application calls the model (`name`, `name@N`), the data key too', () => {
    expect(usageSeries(['capitals', 'capitals@2']).map((s) => s.label)).toEqual(['capitals', 'capitals@2'])
    expect(usageSeries(['capitals@2'])[0].name).toBe('capitals@2')
  })
})

describe('many models', () => {
  const at = '2026-12-01T09:00:00+00:00'
  const models = Array.from({ length: 12 }, (_, i) => `m${String(i).padStart(2, '0')}`)
  // m00 busiest … m11 quietest; one bucket
  const rows = models.map((m, i) => ({ ...row(at, m, 100 - i), latency_ms_avg: 10 + i }))

  it('never gives two lines one colour: past the palette the quietest models are one grey "other" line', () => {
    const { data, models: keys } = pivot(rows, 'requests')
    const series = usageSeries(keys, groupModels(rows).other.length)
    expect(new Set(series.map((s) => s.color)).size).toBe(series.length)
    expect(series.length).toBeLessThanOrEqual(PALETTE.length)
    expect(keys).toEqual([...models.slice(0, PALETTE.length - 1), OTHER])
    expect(series.at(-1)).toEqual({ name: OTHER, label: 'other (4 models)', color: '#bab0ac' })
    // the tail's requests are summed: m08..m11 = 92 + 91 + 90 + 89
    expect(data[0][OTHER]).toBe(92 + 91 + 90 + 89)
  })

  it("weights the other line's latency by requests, and ranks by requests whatever the metric", () => {
    const { data, models: keys } = pivot(rows, 'latency_ms_avg')
    expect(keys.at(-1)).toBe(OTHER)
    const tail = rows.slice(PALETTE.length - 1)
    const mean = tail.reduce((s, r) => s + r.latency_ms_avg * r.requests, 0) / tail.reduce((s, r) => s + r.requests, 0)
    expect(data[0][OTHER]).toBeCloseTo(mean, 9)
    expect(data[0].m00).toBe(10)
  })

  it('keeps every model on its own line up to the palette size', () => {
    const few = rows.slice(0, PALETTE.length)
    expect(groupModels(few)).toEqual({ shown: models.slice(0, PALETTE.length), other: [] })
    expect(new Set(usageSeries(pivot(few, 'requests').models).map((s) => s.color)).size).toBe(PALETTE.length)
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
