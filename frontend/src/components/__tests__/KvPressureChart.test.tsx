import { screen } from '@testing-library/react'
import { describe, expect, it } from 'vitest'
import type { NodeSample } from '../../api/client'
import { KV_CHART_HEIGHT, KV_THRESHOLDS, KvPressureChart, kvPeak, kvPoints, kvTimeAxis, kvTooltipLabel } from '../KvPressureChart'
import { renderWithMantine } from './render'

const sample = (t: string, kv: number | null, running = 1, waiting = 0): NodeSample => ({
  t, healthy: true, kv_cache_usage_perc: kv, num_requests_running: running, num_requests_waiting: waiting,
  num_preemptions_total: 0, preemptions: null, gpu_used: 1, cpu_used: 2,
})

describe('kvPoints', () => {
  it('sorts oldest first, turns the 0..1 gauge into a percent and keeps gaps as null', () => {
    const points = kvPoints([sample('2026-12-01T09:00:10Z', 0.8234, 3, 2), sample('2026-12-01T09:00:00Z', 0.1), sample('2026-12-01T09:00:20Z', null)])
    expect(points).toEqual([
      { t: Date.parse('2026-12-01T09:00:00Z'), kv: 10, running: 1, waiting: 0 },
      { t: Date.parse('2026-12-01T09:00:10Z'), kv: 82.3, running: 3, waiting: 2 },
      { t: Date.parse('2026-12-01T09:00:20Z'), kv: null, running: 1, waiting: 0 },
    ])
    expect(kvPeak([sample('2026-12-01T09:00:00Z', 0.5), sample('2026-12-01T09:00:10Z', 0.97)])).toBe(97)
    expect(kvPeak([sample('2026-12-01T09:00:00Z', null)])).toBeNull()
  })
})

describe('kvTimeAxis', () => {
  it('puts the ticks of an hour of uneven heartbeats on round quarter hours, evenly spaced', () => {
    // As on the fleet page: samples every ~10 s from 20:50:02 to 21:49:32, one late heartbeat and a gap.
    const times = ['20:50:02', '20:50:12', '20:50:31', '21:02:02', '21:14:02', '21:26:02', '21:49:32']
    const axis = kvTimeAxis(kvPoints(times.map((t) => sample(`2026-12-01T${t}Z`, 0.3))))
    expect(axis.type).toBe('number') // a time scale: points sit at their real time, gaps included
    expect(axis.domain).toEqual([Date.parse('2026-12-01T20:50:02Z'), Date.parse('2026-12-01T21:49:32Z')])
    expect(axis.ticks.map(axis.tickFormatter)).toEqual(['21:00', '21:15', '21:30', '21:45'])
    const steps = axis.ticks.slice(1).map((t, i) => t - axis.ticks[i])
    expect(new Set(steps)).toEqual(new Set([15 * 60_000]))
  })

  it('heads the tooltip with the sample time, and with nothing while no point is hovered', () => {
    expect(kvTooltipLabel(Date.parse('2026-12-01T21:49:32Z'))).toBe('21:49:32')
    expect(kvTooltipLabel(undefined)).toBe('') // Recharts renders the tooltip content before any hover
  })
})

describe('KvPressureChart', () => {
  it('names the node and its peak for screen readers, and explains an empty history', () => {
    const { rerender } = renderWithMantine(<KvPressureChart node="gpu-1" samples={[sample('2026-12-01T09:00:00Z', 0.35), sample('2026-12-01T09:00:10Z', 0.9)]} />)
    expect(screen.getByRole('img', { name: 'KV-cache pressure of gpu-1 over time, peak 90 %' })).toBeInTheDocument()
    rerender(<KvPressureChart node="gpu-1" samples={[]} />)
    expect(screen.getByText(/No history yet/)).toBeInTheDocument()
    expect(screen.queryByRole('img')).toBeNull()
  })
})

describe('KV_THRESHOLDS', () => {
  it('keeps the threshold labels apart and out of the thin band under 100 %', () => {
    const place = (p: string | undefined) => p ?? 'insideBottomLeft' // Mantine's default: just above the line, left
    const drawnAbove = (p: string) => p === 'top' || p.startsWith('insideBottom')
    const [low, high] = [...KV_THRESHOLDS].sort((a, b) => Number(a.y) - Number(b.y))
    expect(drawnAbove(place(high.labelPosition as string | undefined))).toBe(false) // nothing between the top line and 100 %
    const left = (p: string | undefined) => place(p).endsWith('Left')
    expect(left(low.labelPosition as string | undefined)).not.toBe(left(high.labelPosition as string | undefined)) // opposite ends
    // A label below the top line fits between the two lines: the plot is the chart less ~40 px of axis and margins;
    // labels are 12 px high.
    expect(((Number(high.y) - Number(low.y)) * (KV_CHART_HEIGHT - 40)) / 100).toBeGreaterThanOrEqual(14)
  })
})
