// A node's KV-cache pressure over time (vllm:kv_cache_usage_perc, 0..1 → %), with running and waiting requests,
// from GET /api/v1/operator/nodes/{name}/samples. Reference lines at GIE's 80 % saturation and vLLM's 90 % tile.
import { LineChart, type ChartReferenceLineProps } from '@mantine/charts'
import { Text } from '@mantine/core'
import type { NodeSample } from '../api/client'
import { formatTime } from '../format'

export type KvPoint = { t: string; kv: number | null; running: number | null; waiting: number | null }

/** Samples → chart points: KV as a whole percent, time as 24-hour HH:MM:SS (`formatTime`), oldest first. */
export function kvPoints(samples: NodeSample[]): KvPoint[] {
  return [...samples]
    .sort((a, b) => a.t.localeCompare(b.t))
    .map((s) => ({
      t: formatTime(s.t),
      kv: s.kv_cache_usage_perc == null ? null : Math.round(s.kv_cache_usage_perc * 1000) / 10,
      running: s.num_requests_running ?? null,
      waiting: s.num_requests_waiting ?? null,
    }))
}

export const KV_CHART_HEIGHT = 200

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
  return (
    <div role="img" aria-label={`KV-cache pressure of ${node} over time, peak ${peak ?? '—'} %`}>
      <LineChart
        h={KV_CHART_HEIGHT}
        data={kvPoints(samples)}
        dataKey="t"
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
