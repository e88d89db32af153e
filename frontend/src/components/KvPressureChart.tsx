// A node's KV-cache pressure over time (vllm:kv_cache_usage_perc, 0..1 → %), with running and waiting requests,
// from GET /api/v1/operator/nodes/{name}/samples. Reference lines at GIE's 80 % saturation and vLLM's 90 % tile.
import { LineChart, type ChartReferenceLineProps } from '@mantine/charts'
import { Text } from '@mantine/core'
import type { NodeSample } from '../api/client'
import { formatTime, tickFormat, timeTicks } from '../format'

export type KvPoint = { t: number; kv: number | null; running: number | null; waiting: number | null }

/** Samples → chart points: KV as a whole percent, time in ms since the epoch (a time axis), oldest first. */
export function kvPoints(samples: NodeSample[]): KvPoint[] {
  return [...samples]
    .sort((a, b) => a.t.localeCompare(b.t))
    .map((s) => ({
      t: Date.parse(s.t),
      kv: s.kv_cache_usage_perc == null ? null : Math.round(s.kv_cache_usage_perc * 1000) / 10,
      running: s.num_requests_running ?? null,
      waiting: s.num_requests_waiting ?? null,
    }))
}

export const KV_CHART_HEIGHT = 200

/** The time axis: a real time scale (samples come with heartbeats, so they are not evenly spaced and may have gaps)
 * with ticks on round times at an even step, instead of every n-th sample's time. */
export function kvTimeAxis(points: KvPoint[]) {
  const from = points.length ? points[0].t : 0
  const to = points.length ? points[points.length - 1].t : 0
  const ticks = timeTicks(from, to)
  return { type: 'number' as const, scale: 'time' as const, domain: [from, to], ticks, tickFormatter: tickFormat(ticks) }
}

/** The tooltip's heading: the hovered sample's time. Recharts also calls it with no label while nothing is hovered. */
export const kvTooltipLabel = (t: unknown): string => (typeof t === 'number' ? formatTime(t) : '')

/** The threshold lines. Each label sits just below its line (Recharts' `insideTop…`), the two at opposite ends: with
 * Mantine's default (`insideBottomLeft`, above the line) both stacked at the left in the thin bands under 100 %. */
export const KV_THRESHOLDS: ChartReferenceLineProps[] = [
  { y: 80, label: 'saturated (80 %)', color: 'orange.6', labelPosition: 'insideTopLeft' },
  { y: 90, label: '90 %', color: 'red.6', labelPosition: 'insideTopRight' },
]

/** The peak KV percent over the samples, or null without data. */
export function kvPeak(samples: NodeSample[]): number | null {
  const values = kvPoints(samples).map((p) => p.kv).filter((v): v is number => v != null)
  return values.length ? Math.max(...values) : null
}

export function KvPressureChart({ node, samples }: { node: string; samples: NodeSample[] }) {
  if (samples.length === 0) return <Text c="dimmed" size="sm">No history yet: samples come with the node's heartbeats.</Text>
  const peak = kvPeak(samples)
  const points = kvPoints(samples)
  return (
    <div role="img" aria-label={`KV-cache pressure of ${node} over time, peak ${peak ?? '—'} %`}>
      <LineChart
        h={KV_CHART_HEIGHT}
        data={points}
        dataKey="t"
        xAxisProps={kvTimeAxis(points)}
        tooltipProps={{ labelFormatter: kvTooltipLabel }}
        yAxisProps={{ domain: [0, 100] }}
        unit=" %"
        withDots={false}
        curveType="linear"
        connectNulls={false}
        series={[{ name: 'kv', label: 'KV cache', color: 'indigo.6' }]}
        referenceLines={KV_THRESHOLDS}
      />
    </div>
  )
}
